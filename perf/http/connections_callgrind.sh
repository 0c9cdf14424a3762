#!/usr/bin/env bash
# perf/http/connections_callgrind.sh — the server's instructions and cache misses per
# confirm iteration (allocate, confirm, release) at several connection
# counts, under callgrind (the many-connections target): counts instructions and
# simulated misses, so it repeats on a noisy machine where req/s does not.
# The last-level cache is simulated at --ll (default 4 MiB, 16-way: this
# machine's L2; its 260 MB L3 would hold everything). One server; after
# `loadgen --scenario confirm --setup-only` the counters are zeroed before
# and dumped after each count's --iterations iterations. Prints per count:
# instructions and misses (read + write) per iteration, then the functions
# with the most misses. Loopback only; bounded by a timeout.
#
# Usage: perf/http/connections_callgrind.sh [--counts "32 1024"] [--iterations 5000]
#          [--stored 10000] [--ll 4194304,16,64] [--top 12]
#          [--bin PATH] [--loadgen PATH] [--port 18731] [-- SERVER FLAGS]
# Binaries default to target/ci (instruction counts are the ci build's,
# perf/README.md); about 1 minute per count.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
COUNTS="32 1024" ITER=5000 STORED=10000 LL=4194304,16,64 TOP=12
BIN=target/ci/hf3fs-meta LOADGEN=target/ci/loadgen PORT=18731
while [[ $# -gt 0 ]]; do
  case "$1" in
    --counts) COUNTS="$2"; shift ;;
    --iterations) ITER="$2"; shift ;;
    --stored) STORED="$2"; shift ;;
    --ll) LL="$2"; shift ;;
    --top) TOP="$2"; shift ;;
    --bin) BIN="$2"; shift ;;
    --loadgen) LOADGEN="$2"; shift ;;
    --port) PORT="$2"; shift ;;
    --) shift; break ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "connections_callgrind.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
OUT=$(mktemp -d /tmp/hf3fs-cg.XXXXXX)
timeout $((300 + 120 * $(wc -w <<<"$COUNTS"))) valgrind --tool=callgrind --cache-sim=yes --LL="$LL" \
  --compress-strings=no --compress-pos=no --callgrind-out-file="$OUT/cg.out" \
  "$BIN" --host 127.0.0.1 --port "$PORT" --log-level warn "$@" >"$OUT/server.log" 2>&1 &
TPID=$!
trap 'kill $TPID 2>/dev/null; wait 2>/dev/null; rm -rf "$OUT"' EXIT
for _ in $(seq 600); do curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break; sleep 0.2; done
VPID=$(pgrep -P "$TPID" | head -n 1) # timeout's child is valgrind
"$LOADGEN" --addr "127.0.0.1:$PORT" --scenario confirm --setup-only --stored "$STORED" 2>/dev/null
i=0
for n in $COUNTS; do
  i=$((i + 1))
  callgrind_control -z "$VPID" >/dev/null 2>&1
  "$LOADGEN" --addr "127.0.0.1:$PORT" --scenario confirm --no-setup --json --connections "$n" --duration 600 \
    --max-requests $((3 * ITER)) >"$OUT/lg-$n.json"
  callgrind_control -d "connections-$n" "$VPID" >/dev/null 2>&1
  python3 - "$OUT/cg.out.$i" "$n" "$ITER" "$TOP" <<'PY'
import re, subprocess, sys
path, n, iters, top = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
summary = next(l for l in open(path) if l.startswith("summary:")).split()[1:]
ev = next(l for l in open(path) if l.startswith("events:")).split()[1:]
v = dict(zip(ev, map(int, summary)))
miss = v["DLmr"] + v["DLmw"]
print(f"\n## {n} connections: {v['Ir'] / iters / 1000:.0f}k instructions, {miss / iters:.0f} LL misses "
      f"({v['DLmr'] / iters:.0f} read + {v['DLmw'] / iters:.0f} write) per iteration")
out = subprocess.run(["callgrind_annotate", "--inclusive=no", "--threshold=100", "--auto=no", "--show=DLmr,DLmw,Ir", "--sort=DLmr,DLmw", path],
                     capture_output=True, text=True).stdout.splitlines()
# Rows: "DLmr (pct) DLmw (pct) Ir (pct) file:function", a "." for a zero (no pct).
cell = r"([\d,]+|\.)\s*(?:\(\s*[\d.]+%\))?\s+"
row = re.compile(r"^\s*" + cell * 3 + r"(\S.*)$")
skip = ("PROGRAM TOTALS", "main [", "0x0000", "clone.S", "pthread_create", "thread_start", "call_once", "__rust_begin_short_backtrace", "libc_start", "(below main)", "task/raw.rs")
rows = []
for line in out:
    m = row.match(line)
    if not m or any(k in line for k in skip):
        continue
    num = lambda x: 0 if x == "." else int(x.replace(",", ""))
    rd, wr = num(m.group(1)), num(m.group(2))
    name = m.group(4)
    rows.append((rd + wr, rd, wr, name.split(":", 1)[1] if ":" in name else name))
for total, rd, wr, name in sorted(rows, reverse=True)[:top]:
    print(f"  {rd / iters:7.1f} rd {wr / iters:7.1f} wr  {name[:150]}")
PY
done
