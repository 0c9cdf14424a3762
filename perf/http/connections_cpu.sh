#!/usr/bin/env bash
# perf/http/connections_cpu.sh — where the CPU goes as the number of keep-alive
# connections grows (the many-connections target): for each count, a fixed number of requests
# against the server and against the bare-hyper ceiling, alternated, and the
# CPU time (utime + stime) that the target AND the load generator each burned,
# per request. On a 2-core machine the load generator shares the cores with
# the target: if its own CPU per request grows with the count, the req/s of
# any target falls with it, and a req/s ratio between counts measures the
# load generator as much as the server.
#
# Usage: perf/http/connections_cpu.sh [--counts "32 1024 4096"] [--requests 60000]
#                         [--scenario exists] [--rounds 2] [-- loadgen options]
# Environment: LOADGENS="A B" alternates several loadgen binaries (default
# target/release/loadgen), to compare two builds of the load generator.
# Needs the release binaries (perf/run.sh builds them). Loopback only; every
# run is bounded by its request count and by --duration 120.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
# shellcheck source=perf/lib.sh
source perf/lib.sh
COUNTS="32 1024 4096" N=60000 SCENARIO=exists ROUNDS=2
while [[ $# -gt 0 ]]; do
  case "$1" in
    --counts) COUNTS="$2"; shift ;;
    --requests) N="$2"; shift ;;
    --scenario) SCENARIO="$2"; shift ;;
    --rounds) ROUNDS="$2"; shift ;;
    --) shift; break ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "connections_cpu.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
EXTRA=("$@")
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
BIN=target/release
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

SP=$(free_port); CP=$(free_port)
HF3FS_META_LOG_LEVEL=warn RUST_LOG=warn timeout 3600 "$BIN/hf3fs-meta" --host 127.0.0.1 --port "$SP" ${SERVER_ARGS:-} >/dev/null 2>&1 &
pids+=($!); SPID=$!
timeout 3600 "$BIN/ceiling" --addr "127.0.0.1:$CP" >/dev/null 2>&1 & pids+=($!); CPID=$!
wait_port "$SP"; wait_port "$CP"
# timeout's child is the target itself.
SPID=$(pgrep -P "$SPID" | head -n 1); CPID=$(pgrep -P "$CPID" | head -n 1)
"$BIN/loadgen" --addr "127.0.0.1:$SP" --scenario "$SCENARIO" --setup-only >/dev/null 2>&1

# One run: prints "target_us loadgen_us rps" (CPU µs per timed request).
measure() { # pid port connections extra...
  python3 - "$@" <<'PY'
import json, os, subprocess, sys
pid, port, conns, *extra = sys.argv[1:]
tick = os.sysconf("SC_CLK_TCK")
def cpu():
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / tick
before = cpu()
p = subprocess.Popen([os.environ["LG"], "--addr", f"127.0.0.1:{port}", "--json", "--no-setup",
                      "--connections", conns, "--duration", "120", "--threads", "2", *extra],
                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
out = p.stdout.read()
_, _, ru = os.wait4(p.pid, 0)
after = cpu()
r = json.loads(out)
n = r["requests"] + r.get("aux_requests", 0)
print(f"{(after - before) / n * 1e6:.1f} {(ru.ru_utime + ru.ru_stime) / n * 1e6:.1f} {r['rps']:.0f}")
PY
}

LOADGENS=${LOADGENS:-target/release/loadgen}
echo "| connections | target | loadgen | target CPU µs/request | loadgen CPU µs/request | req/s |"
echo "|---:|---|---|---:|---:|---:|"
for n in $COUNTS; do
  for r in $(seq 1 "$ROUNDS"); do
    for t in "server $SPID $SP" "ceiling $CPID $CP"; do
      read -r name pid port <<<"$t"
      for lg in $LOADGENS; do
        read -r tu lu rps < <(LG=$lg measure "$pid" "$port" "$n" --scenario "$SCENARIO" --max-requests "$N" "${EXTRA[@]}")
        echo "| $n | $name (r$r) | $(basename "$lg") | $tu | $lu | $rps |"
      done
    done
  done
done
