#!/usr/bin/env bash
# perf/scale/memory_growth.sh — resident memory while the key index grows (issue
# 14, item 1): starts the server, stores --stored keys on --ranks ranks
# (loadgen --setup-only: allocate + confirm on every rank), samples the
# server's VmRSS and VmHWM from /proc every 0.2 s, and prints one line:
# peak (VmHWM), steady (VmRSS once the load is over and the allocator has
# settled), their ratio and the bytes per stored key (steady minus the idle
# server's RSS, divided by the keys). Loopback only.
#
# Usage: perf/scale/memory_growth.sh [--stored 1000000] [--ranks 8] [--bin PATH]
#                              [--port 18611] [--settle 3] [--smaps]
#                              [-- SERVER FLAGS]
# --smaps also prints the server's largest mappings by resident memory
# (/proc/PID/smaps), to tell the key index's arena (29 MiB segments), the
# page tables (one mapping per array per rank) and the heap apart.
# The binaries default to target/ci (cargo build --profile ci, and
# cargo build --profile ci -p hf3fs-perf --bin loadgen).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
STORED=1000000 RANKS=8 BIN=target/ci/hf3fs-meta LOADGEN=target/ci/loadgen PORT=18611 SETTLE=3 SMAPS=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --stored) STORED="$2"; shift ;;
    --ranks) RANKS="$2"; shift ;;
    --bin) BIN="$2"; shift ;;
    --loadgen) LOADGEN="$2"; shift ;;
    --port) PORT="$2"; shift ;;
    --settle) SETTLE="$2"; shift ;;
    --smaps) SMAPS=1; shift; continue ;;
    --) shift; break ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "memory_growth.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
PAGES=$((STORED + STORED / 10 + 1024))
LOG=$(mktemp /tmp/hf3fs-mem.XXXXXX)
"$BIN" --host 127.0.0.1 --port "$PORT" --log-level warn --world-size "$RANKS" "$@" >"$LOG" 2>&1 &
PID=$!
trap 'kill "$PID" 2>/dev/null; wait "$PID" 2>/dev/null; rm -f "$LOG"' EXIT
for _ in $(seq 100); do
  curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break
  sleep 0.1
done
kb() { awk -v f="$1:" '$1 == f { print $2 }' "/proc/$PID/status"; }
IDLE=$(kb VmRSS)
MAX_RSS=0
"$LOADGEN" --addr "127.0.0.1:$PORT" --setup-only --ranks "$RANKS" --pages "$PAGES" --stored "$STORED" >/dev/null 2>&1 &
GEN=$!
while kill -0 "$GEN" 2>/dev/null; do
  r=$(kb VmRSS)
  ((r > MAX_RSS)) && MAX_RSS=$r
  sleep 0.2
done
wait "$GEN"
sleep "$SETTLE"
STEADY=$(kb VmRSS) HWM=$(kb VmHWM)
SLOTS=$(curl -sf "http://127.0.0.1:$PORT/stats" | sed -n 's/.*"index_slots":\([0-9]*\).*/\1/p')
KEYS=$(curl -sf "http://127.0.0.1:$PORT/stats" | sed -n 's/.*"keys":\([0-9]*\),"complete_keys".*/\1/p')
awk -v idle="$IDLE" -v hwm="$HWM" -v steady="$STEADY" -v keys="$KEYS" -v slots="$SLOTS" -v ranks="$RANKS" 'BEGIN {
  printf "keys %d on %d ranks, index slots %d: idle %.1f MB, peak (VmHWM) %.1f MB, steady (VmRSS) %.1f MB, peak/steady %.2f, %.0f bytes per key\n",
    keys, ranks, slots, idle / 1024, hwm / 1024, steady / 1024, hwm / steady, (steady - idle) * 1024 / keys }'
if ((SMAPS)); then
  echo "largest mappings by resident memory (size and Rss in MB):"
  awk '/^[0-9a-f]+-[0-9a-f]+ / { name = $6 } /^Size:/ { size = $2 / 1024 }
       /^Rss:/ { if ($2 > 1024) printf "  %10.1f %10.1f %s\n", size, $2 / 1024, name }' "/proc/$PID/smaps" | sort -k2 -n -r | head -20
fi
