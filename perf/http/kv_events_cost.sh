#!/usr/bin/env bash
# perf/http/kv_events_cost.sh — what KV events cost the write routes, side
# by side in one run: instructions per request (callgrind,
# perf/http/instructions.sh) of each route with events off, on with no
# subscriber, on with one subscriber draining the PUB, and on with one
# slow subscriber that never reads. Callgrind counts every thread of the
# server, so "on" includes the publisher task (hashes, msgpack, the PUB).
#
# Usage: perf/http/kv_events_cost.sh [--bin PATH] [--routes "R ..."] [--python PATH]
#   --routes   default "vllm_confirm vllm_release sglang_confirm"
#   --python   an interpreter with pyzmq (default .venv/bin/python)
# Loopback only; the subscribers it starts are killed on exit.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source perf/lib.sh
BIN="" ROUTES="vllm_confirm vllm_release sglang_confirm" PY=.venv/bin/python
while [[ $# -gt 0 ]]; do
  case "$1" in
    --bin) BIN="$2"; shift ;;
    --routes) ROUTES="$2"; shift ;;
    --python) PY="$2"; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "kv_events_cost.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
[ -n "$BIN" ] || { perf_build ci -q -p hf3fs-meta --bin hf3fs-meta; BIN="$(perf_bin_dir ci)/hf3fs-meta"; }
SUBPID=""
trap '[ -z "$SUBPID" ] || kill "$SUBPID" 2>/dev/null; wait 2>/dev/null || true' EXIT

run() { # $1: label; $2: server args; $3: subscriber mode (none, fast, slow)
  local label=$1 args=$2 mode=$3
  if [ "$mode" != none ]; then
    local ep=${args#*--kv-events-endpoint }; ep=${ep%% *}
    "$PY" perf/http/kv_events_sub.py --endpoint "$ep" $([ "$mode" = slow ] && echo --slow) &
    SUBPID=$!
  fi
  echo "## $label"
  perf/http/instructions.sh --bin "$BIN" --routes "$ROUTES" --server-args "$args" | grep '^|'
  if [ -n "$SUBPID" ]; then kill "$SUBPID"; wait "$SUBPID" 2>/dev/null || true; SUBPID=""; fi
  echo
}

on="--kv-events-endpoint tcp://127.0.0.1:$(free_port) --kv-events-bind --kv-events-heartbeat-ms 0"
run "events off" "" none
run "events on, no subscriber" "$on" none
run "events on, one subscriber" "$on" fast
run "events on, one slow subscriber" "$on" slow
