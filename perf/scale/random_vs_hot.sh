#!/usr/bin/env bash
# perf/scale/random_vs_hot.sh — lookups of random stored keys against the same hot
# keys over HTTP (the scale target "exists of 128 random stored keys keeps
# >= 0.7x the throughput of 128 hot keys"). Starts ONE server, stores
# --stored keys on rank 0 (loadgen's setup, then half a second of random
# exists whose answers it checks: all true), then for each scenario
# alternates two loads on it, --rounds times:
#   hot:    every request carries the same --batch keys (loadgen --pool-bodies 1)
#   random: each request carries --batch keys drawn at random among the stored
#           ones, cycling through about --stored / --batch distinct bodies
#           (at most 65,536), so the index entries are spread over the table
# The order within a round flips every round (hot first, then random first)
# so that a drift of the machine's load hits both alike. Prints one line per
# run and a table of medians with the random/hot ratio. With --ceiling PATH
# the bare hyper server (perf/src/bin/ceiling.rs) gets the same two loads in
# the same rounds, as a control: it does no lookup, so whatever its random
# runs lose against its hot ones is the load generator's and the kernel's
# (sending bodies from a larger pool), not the index's. Loopback only; every
# run is bounded by --duration and the servers by a timeout.
#
# Usage: perf/scale/random_vs_hot.sh [--stored 1000000] [--rounds 5] [--duration 3]
#          [--warmup 0.5] [--connections 32] [--batch 128]
#          [--scenarios "exists locations"] [--loadgen-threads 1]
#          [--bin PATH] [--loadgen PATH] [--ceiling PATH] [--port 18621]
#          [-- SERVER FLAGS]
# The binaries default to target/release (wall-clock figures are the
# release build's, perf/README.md: cargo build --release, and
# cargo build --release -p hf3fs-perf --bin loadgen); --bin picks another
# server binary, e.g. one built from another commit, to compare two indexes.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
STORED=1000000 ROUNDS=5 DURATION=3 WARMUP=0.5 CONNS=32 BATCH=128 SCENARIOS="exists locations" LGT=1
BIN=target/release/hf3fs-meta LOADGEN=target/release/loadgen PORT=18621 CEILING=
while [[ $# -gt 0 ]]; do
  case "$1" in
    --stored) STORED="$2"; shift ;;
    --rounds) ROUNDS="$2"; shift ;;
    --duration) DURATION="$2"; shift ;;
    --warmup) WARMUP="$2"; shift ;;
    --connections) CONNS="$2"; shift ;;
    --batch) BATCH="$2"; shift ;;
    --scenarios) SCENARIOS="$2"; shift ;;
    --loadgen-threads) LGT="$2"; shift ;;
    --bin) BIN="$2"; shift ;;
    --loadgen) LOADGEN="$2"; shift ;;
    --ceiling) CEILING="$2"; shift ;;
    --port) PORT="$2"; shift ;;
    --) shift; break ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "random_vs_hot.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
for f in "$BIN" "$LOADGEN" ${CEILING:+"$CEILING"}; do
  [[ -x $f ]] || { echo "random_vs_hot.sh: $f is not an executable (build it first)" >&2; exit 2; }
done
PAGES=$((STORED + STORED / 10 + 1024))
BODIES=$(((STORED + BATCH - 1) / BATCH))
((BODIES > 65536)) && BODIES=65536
((BODIES < 1)) && BODIES=1
# Bound the server's life: setup (about 20 s per 10^6 keys on this machine)
# plus every run, with a generous margin.
LIFE=$((120 + STORED / 20000 + ROUNDS * 4 * $(wc -w <<<"$SCENARIOS") * (${DURATION%.*} + 10)))
LOG=$(mktemp /tmp/hf3fs-rvh.XXXXXX)
RUNS=$(mktemp /tmp/hf3fs-rvh-runs.XXXXXX)
HF3FS_META_LOG_LEVEL=warn RUST_LOG=warn timeout "$LIFE" "$BIN" --host 127.0.0.1 --port "$PORT" "$@" >"$LOG" 2>&1 &
PID=$!
CPID=
trap 'kill $PID $CPID 2>/dev/null; wait 2>/dev/null; rm -f "$LOG" "$RUNS"' EXIT
if [[ -n $CEILING ]]; then
  "$CEILING" --addr "127.0.0.1:$((PORT + 1))" --exit-after "$LIFE" >/dev/null 2>&1 &
  CPID=$!
  for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$((PORT + 1))") 2>/dev/null && break; sleep 0.1; done
fi
for _ in $(seq 100); do
  curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break
  kill -0 "$PID" 2>/dev/null || { echo "random_vs_hot.sh: the server exited:" >&2; cat "$LOG" >&2; exit 2; }
  sleep 0.1
done
echo "server $BIN ($(git rev-parse --short HEAD 2>/dev/null || echo '?') checked out), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
t0=$(date +%s.%N)
# Setup (stores the keys) and a short validated run of random exists: every
# answer must say true, or loadgen exits 1 and so does this script.
"$LOADGEN" --addr "127.0.0.1:$PORT" --scenario exists --pages "$PAGES" --stored "$STORED" --batch "$BATCH" \
  --pool-bodies "$BODIES" --duration 0.5 --label check
echo "stored and checked $STORED keys in $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s; random bodies: $BODIES of $BATCH keys"

run() { # scenario kind [port label-prefix]
  local bodies=1
  [[ $2 == random ]] && bodies=$BODIES
  # --no-setup keeps the stored keys; --stored and --hit-ratio 1 draw every key among them.
  "$LOADGEN" --addr "127.0.0.1:${3:-$PORT}" --no-setup --json --scenario "$1" --stored "$STORED" --hit-ratio 1 \
    --pool-bodies "$bodies" --batch "$BATCH" --connections "$CONNS" --threads "$LGT" \
    --duration "$DURATION" --warmup "$WARMUP" --label "${4:-}$2" | tee -a "$RUNS" |
    python3 -c 'import json, sys; r = json.load(sys.stdin); print("%10s %6s: %9.0f req/s  p50 %d us  p99 %d us  errors %d" % (
      r["scenario"], r["label"], r["rps"], r["p50_us"], r["p99_us"], r["http_errors"] + r["conn_errors"]))'
}
for s in $SCENARIOS; do
  for r in $(seq 1 "$ROUNDS"); do
    if ((r % 2)); then kinds="hot random"; else kinds="random hot"; fi
    for k in $kinds; do
      run "$s" "$k"
      [[ -z $CEILING ]] || run "$s" "$k" $((PORT + 1)) ceiling-
    done
  done
done
python3 - "$RUNS" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
med = lambda s, k, f: statistics.median(r[f] for r in runs if r["scenario"] == s and r["label"] == k)
bad = sum(r["http_errors"] + r["conn_errors"] for r in runs)
print("\n| scenario | target | hot req/s | random req/s | random / hot | hot p50 | random p50 | hot p99 | random p99 |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
for s in dict.fromkeys(r["scenario"] for r in runs):
    for t in ("", "ceiling-"):
        if not any(r["scenario"] == s and r["label"] == t + "hot" for r in runs):
            continue
        h, x = med(s, t + "hot", "rps"), med(s, t + "random", "rps")
        print(f"| {s} | {t.rstrip('-') or 'server'} | {h:,.0f} | {x:,.0f} | {x / h:.2f} "
              f"| {med(s, t + 'hot', 'p50_us'):.0f} µs | {med(s, t + 'random', 'p50_us'):.0f} µs "
              f"| {med(s, t + 'hot', 'p99_us'):.0f} µs | {med(s, t + 'random', 'p99_us'):.0f} µs |")
rounds = sum(r["label"] == "hot" for r in runs) // max(1, len({r["scenario"] for r in runs}))
print(f"\n(medians of {rounds} rounds; {bad} HTTP or connection errors in all)")
sys.exit(1 if bad else 0)
PY
