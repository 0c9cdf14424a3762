#!/usr/bin/env bash
# perf/connections.sh — how the server holds up with many clients (issue 14):
# perf/run.sh at 32, 256, 1,024 and 4,096 keep-alive connections (the
# server's default cap is 4,096), exists and confirm, server and bare-hyper
# ceiling alternated, one table per connection count, then one summary table
# of req/s, p50, p99 and p99.9 per count. Loopback only.
#
# Usage: perf/connections.sh [--counts "32 256 1024 4096"] [--rounds 2]
#                            [--duration 3] [--no-build]
# Extra options after `--` go to perf/run.sh.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
COUNTS="32 256 1024 4096" ROUNDS=2 DURATION=3 BUILD=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --counts) COUNTS="$2"; shift ;;
    --rounds) ROUNDS="$2"; shift ;;
    --duration) DURATION="$2"; shift ;;
    --no-build) BUILD=(--no-build) ;;
    --) shift; break ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "connections.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
# 4,096 client sockets plus as many server ones, in one process each.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
OUT=$(mktemp -d /tmp/hf3fs-conns.XXXXXX)
trap 'rm -rf "$OUT"' EXIT
first=1
for n in $COUNTS; do
  perf/run.sh "${BUILD[@]}" --no-plot --scenarios "exists confirm" --rounds "$ROUNDS" --duration "$DURATION" \
    --connections "$n" "$@" >"$OUT/run-$n.md" 2>"$OUT/run-$n.log" || { tail -n 20 "$OUT/run-$n.log" >&2; exit 1; }
  [[ $first == 1 ]] && BUILD=(--no-build) && first=0
  echo "### $n connections"
  echo
  grep -E '^\|' "$OUT/run-$n.md"
  echo
done
