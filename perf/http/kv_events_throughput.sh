#!/usr/bin/env bash
# perf/http/kv_events_throughput.sh — confirm_write throughput with KV events
# off and on, side by side: two servers run at once (one without
# --kv-events-endpoint, one with it and a subscriber draining the PUB), and
# loadgen's confirm scenario (allocate untimed, confirm_write timed, release
# untimed; 128 keys a request) alternates between them, round after round,
# so that the machine's load falls on both alike. Prints each round's req/s,
# the medians and their ratio, and from the "on" server's /metrics the events
# and batches published, dropped and the replay buffer's bytes (after the
# rounds; with more than --kv-events-buffer-steps batches published, the
# buffer is full at its default size).
#
# Usage: perf/http/kv_events_throughput.sh [--bin PATH] [--loadgen PATH]
#          [--rounds N] [--seconds S] [--connections C] [--python PATH]
#   defaults: the ci builds, 5 rounds of 4 s each, 16 connections,
#   .venv/bin/python (with pyzmq) for the subscriber.
# Loopback only; everything it starts is killed on exit.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source perf/lib.sh
BIN="" LOADGEN="" ROUNDS=5 SECONDS_=4 CONNS=16 PY=.venv/bin/python
while [[ $# -gt 0 ]]; do
  case "$1" in
    --bin) BIN="$2"; shift ;;
    --loadgen) LOADGEN="$2"; shift ;;
    --rounds) ROUNDS="$2"; shift ;;
    --seconds) SECONDS_="$2"; shift ;;
    --connections) CONNS="$2"; shift ;;
    --python) PY="$2"; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "kv_events_throughput.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
[ -n "$BIN" ] || { perf_build ci -q -p hf3fs-meta --bin hf3fs-meta; BIN="$(perf_bin_dir ci)/hf3fs-meta"; }
[ -n "$LOADGEN" ] || { perf_build ci -q -p hf3fs-perf --bin loadgen; LOADGEN="$(perf_bin_dir ci)/loadgen"; }
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true' EXIT
off=$(free_port) on=$(free_port) pub=$(free_port)
"$BIN" --host 127.0.0.1 --port "$off" --log-level warn >/dev/null 2>&1 & PIDS+=($!)
"$BIN" --host 127.0.0.1 --port "$on" --log-level warn --kv-events-endpoint "tcp://127.0.0.1:$pub" \
  --kv-events-bind >/dev/null 2>&1 & PIDS+=($!)
wait_port "$off"; wait_port "$on"
"$PY" perf/http/kv_events_sub.py --endpoint "tcp://127.0.0.1:$pub" & PIDS+=($!)
round() { # $1: port; prints req/s
  "$LOADGEN" --addr "127.0.0.1:$1" --scenario confirm --connections "$CONNS" --duration "$SECONDS_" \
    --warmup 0.5 --json | python3 -c 'import json,sys; print(round(json.load(sys.stdin)["rps"]))'
}
offs=() ons=()
for i in $(seq "$ROUNDS"); do
  a=$(round "$off"); b=$(round "$on")
  offs+=("$a"); ons+=("$b")
  echo "round $i: events off $a req/s, on $b req/s"
done
python3 - "${offs[*]}" "${ons[*]}" <<'PY'
import statistics, sys
off = [int(x) for x in sys.argv[1].split()]; on = [int(x) for x in sys.argv[2].split()]
mo, mn = statistics.median(off), statistics.median(on)
print(f"median: events off {mo:.0f} req/s, on {mn:.0f} req/s, ratio {mn / mo:.3f}")
PY
curl -s "http://127.0.0.1:$on/metrics" | grep -E '^hf3fs_meta_kv_events_(published|batches_published|dropped|dropped_batches|replay_buffer_bytes|queued_batches|subscribers)(_total)? '
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
