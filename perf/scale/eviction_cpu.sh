#!/usr/bin/env bash
# perf/scale/eviction_cpu.sh — what eviction costs at a steady allocation rate
# (eviction with read leases): the connector's save (allocate fresh keys, confirm them, never
# release) at --rate requests/s of 128 keys against two servers, one after
# the other, each with eviction on:
#   full:  one rank of --pages pages, which the load fills within the warmup;
#          from then on every new key evicts an old one;
#   roomy: one rank ten times larger, which the run never fills.
# Over the measured window it reports, for each, the server's CPU (utime +
# stime from /proc) per second, and for the full one the background
# evictor's own time (hf3fs_meta_evictor_pass_seconds_total) and the keys
# evicted by reason. Loopback only; everything it starts is killed on exit.
#
# Usage: perf/scale/eviction_cpu.sh [--rate 390] [--pages 1000000] [--warmup 30]
#                             [--duration 30] [--no-build]
# (390 requests/s of 128 keys = 50k allocations/s.)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
# shellcheck source=perf/lib.sh
source perf/lib.sh
REL=$(perf_bin_dir release)
RATE=390 PAGES=1000000 WARMUP=30 DURATION=30 BUILD=1
while [[ $# -gt 0 ]]; do
  case "$1" in
    --rate) RATE="$2"; shift ;;
    --pages) PAGES="$2"; shift ;;
    --warmup) WARMUP="$2"; shift ;;
    --duration) DURATION="$2"; shift ;;
    --no-build) BUILD=0 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "eviction_cpu.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
if [[ $BUILD == 1 ]]; then
  perf_build release >/dev/null 2>&1 && perf_build release -p hf3fs-perf >/dev/null 2>&1 ||
    { echo "eviction_cpu.sh: build failed" >&2; exit 1; }
fi
TMP=$(mktemp -d /tmp/hf3fs-evcpu.XXXXXX)
PID=""
cleanup() { [[ -n "$PID" ]] && kill -TERM "$PID" 2>/dev/null; wait 2>/dev/null; rm -rf "$TMP"; }
trap cleanup EXIT
HZ=$(getconf CLK_TCK)
cpu() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
metric() { # name-with-labels
  curl -s "http://127.0.0.1:$PORT/metrics" | awk -v m="$1" '$1 == m { print $2 }'
}
run() { # label pages
  PORT=$(( 20000 + RANDOM % 30000 ))
  timeout --kill-after=5 $(( WARMUP + DURATION + 120 )) env HF3FS_META_LOG_LEVEL=warn \
    "$REL/hf3fs-meta" --host 127.0.0.1 --port "$PORT" --world-size 1 --eviction clock --read-lease 0 \
    --max-pages-per-rank $(( PAGES * 10 )) >"$TMP/server-$1.log" 2>&1 &
  PID=$!
  for _ in $(seq 1 200); do (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break; sleep 0.05; done
  # The server is `timeout`'s child: its CPU is what we read.
  local SRV
  SRV=$(pgrep -P "$PID" -x hf3fs-meta | head -n 1)
  "$REL/loadgen" --addr "127.0.0.1:$PORT" --scenario save --rate "$RATE" --connections 4 --threads 1 \
    --ranks 1 --pages "$2" --stored 0 --warmup "$WARMUP" --duration "$DURATION" --json --label "$1" \
    >"$TMP/loadgen-$1.json" 2>"$TMP/loadgen-$1.err" &
  local lg=$!
  sleep "$WARMUP"
  local c0 e0 w0 a0 t0
  c0=$(cpu "$SRV"); e0=$(metric hf3fs_meta_evictor_pass_seconds_total)
  w0=$(metric 'hf3fs_meta_evictions_total{reason="watermark"}'); a0=$(metric 'hf3fs_meta_evictions_total{reason="allocate"}')
  t0=$(date +%s.%N)
  wait "$lg" || true
  local c1 e1 w1 a1 t1
  c1=$(cpu "$SRV"); e1=$(metric hf3fs_meta_evictor_pass_seconds_total)
  w1=$(metric 'hf3fs_meta_evictions_total{reason="watermark"}'); a1=$(metric 'hf3fs_meta_evictions_total{reason="allocate"}')
  t1=$(date +%s.%N)
  kill -TERM "$PID"; wait "$PID" 2>/dev/null || true; PID=""
  awk -v l="$1" -v c0="$c0" -v c1="$c1" -v e0="$e0" -v e1="$e1" -v w0="$w0" -v w1="$w1" -v a0="$a0" -v a1="$a1" \
      -v t0="$t0" -v t1="$t1" -v hz="$HZ" -v rate="$RATE" -v lg="$(sed -nE 's/.*"rps":([0-9.]+).*/\1/p' "$TMP/loadgen-$1.json")" \
    'BEGIN { s = t1 - t0; printf "| %s | %.0f | %.3f | %.4f | %.0f | %.0f |\n", l, lg, (c1 - c0) / hz / s, (e1 - e0) / s, (w1 - w0) / s, (a1 - a0) / s }'
}
echo "rate $RATE saves/s of 128 keys, --pages $PAGES, warmup ${WARMUP}s, measured ${DURATION}s, commit $(git rev-parse --short HEAD)"
echo
echo "| server | confirms/s measured | server CPU (cores) | evictor CPU (cores) | keys evicted/s (watermark) | keys evicted/s (allocate) |"
echo "|---|---:|---:|---:|---:|---:|"
run full "$PAGES"
run roomy "$(( PAGES * 10 ))"
