#!/usr/bin/env bash
# Failover time of `--ha etcd`, through the relay: one etcd member on
# loopback (fast raft timings), three hf3fs-meta nodes with a 2 s lease, one
# relay. Each round SIGKILLs the serving leader and times how long until
# clients through the relay are served again; the killed node is restarted
# (on its data directory, with --replicated) and rejoins as a follower.
# Prints every round, then the median and the maximum.
#
# Two modes:
# - default, the control plane only: election only (--ha-promote-without-state,
#   no replicated state); timed to the first 200 of a `batch_exists`.
# - --replicated: every node has --data-dir (--fsync always, --ha-sync
#   strict) and the leader streams to its synchronous standby; a light write
#   load (perf/ha/failover_writer.py: a save of 16 keys, ~20/s) runs through the relay
#   the whole time; timed from the SIGKILL to the first write (a confirm)
#   answered 204 through the relay by the new leader (by its epoch header). Before each kill, the leader has a
#   standby in sync and the load is being acknowledged.
#
#   perf/ha/failover.sh [--replicated] [rounds=20]   BIN=target/release/hf3fs-meta by default
#
# Needs etcd, curl and python3. Loopback only; bounded: each round gives up
# after 30 s.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
REPLICATED=0
if [ "${1:-}" = --replicated ]; then REPLICATED=1; shift; fi
ROUNDS="${1:-20}"
BIN="${BIN:-target/release/hf3fs-meta}"
TTL=2
[ -x "$BIN" ] || { echo "no $BIN: cargo build --release (or set BIN)" >&2; exit 2; }
command -v etcd >/dev/null || { echo "etcd is not installed" >&2; exit 2; }

WORK="$(mktemp -d)"
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
    for f in "$WORK"/*.pid; do [ -f "$f" ] && kill -9 "$(cat "$f")" 2>/dev/null || true; done
    rm -rf "$WORK"
}
trap cleanup EXIT

# shellcheck source=perf/lib.sh
source perf/lib.sh
etcd_one
EP=$ETCD_URL
declare -A PORT=([a]=$(free_port) [b]=$(free_port) [c]=$(free_port))

start_node() {
    local id=$1 mode=(--ha-promote-without-state)
    [ "$REPLICATED" = 1 ] && mode=(--data-dir "$WORK/data-$id" --fsync always --ha-sync strict)
    "$BIN" --host 127.0.0.1 --port "${PORT[$id]}" --workers 1 --ha etcd --etcd-endpoints "$EP" \
        --ha-cluster /perf --node-id "$id" --advertise-url "http://127.0.0.1:${PORT[$id]}" \
        --ha-lease-ttl "$TTL" --ha-token-file "$WORK/token" "${mode[@]}" \
        >>"$WORK/$id.log" 2>&1 &
    echo $! >"$WORK/$id.pid"
    disown # no "Killed" line from bash for the rounds' SIGKILLs
}
for id in a b c; do start_node "$id"; done
RP=$(free_port)
"$BIN" relay --listen "127.0.0.1:$RP" --etcd-endpoints "$EP" --ha-cluster /perf --ha-lease-ttl "$TTL" \
    >"$WORK/relay.log" 2>&1 &
PIDS+=($!)

probe() {
    curl -s -o /dev/null -w '%{http_code}' --max-time 10 -X POST "http://127.0.0.1:$RP/keys/batch_exists" \
        -H 'Content-Type: application/json' -d '{"keys":["0123456789abcdef0123456789abcdef"]}' || true
}
leader() { curl -s --max-time 5 "http://127.0.0.1:$RP/stats" | python3 -c 'import json,sys; print(json.load(sys.stdin)["ha"]["node"])'; }
has_standby() { curl -s --max-time 5 "http://127.0.0.1:$RP/health" | python3 -c 'import json,sys; sys.exit(0 if json.load(sys.stdin)["ha"]["standby"] else 1)'; }
# The write load's acknowledged confirms (--replicated): when each was
# answered (wall-clock) and the epoch of the leader that answered.
WLOG="$WORK/writes.log"
acked() { wc -l <"$WLOG"; }
# When the first write answered by a leader of an epoch above $1 was, if any.
acked_after() { awk -v e="$1" '$2 + 0 > e + 0 { print $1; exit }' "$WLOG"; }
epoch() { curl -s --max-time 5 "http://127.0.0.1:$RP/health" | python3 -c 'import json,sys; print(json.load(sys.stdin)["ha"]["epoch"])'; }
if [ "$REPLICATED" = 1 ]; then
    : >"$WLOG"
    python3 perf/ha/failover_writer.py "127.0.0.1:$RP" "$WLOG" &
    PIDS+=($!)
fi

times=()
for r in $(seq "$ROUNDS"); do
    # A serving leader with a live standby named, as before every kill (and,
    # replicated, writes being acknowledged).
    for _ in $(seq 300); do [ "$(probe)" = 200 ] && has_standby 2>/dev/null && break; sleep 0.1; done
    if [ "$REPLICATED" = 1 ]; then
        n=$(acked)
        for _ in $(seq 300); do [ "$(acked)" -ge $((n + 5)) ] && break; sleep 0.1; done
    fi
    L=$(leader)
    E=0
    if [ "$REPLICATED" = 1 ]; then
        E=
        for _ in $(seq 100); do E=$(epoch 2>/dev/null) && [ -n "$E" ] && break; sleep 0.1; done
        [ -n "$E" ] || { echo "round $r: the leader's epoch could not be read" >&2; exit 1; }
    fi
    P=$(cat "$WORK/$L.pid")
    t0=$(date +%s.%N)
    kill -9 "$P"
    if [ "$REPLICATED" = 1 ]; then
        t1=
        for _ in $(seq 3000); do
            t1=$(acked_after "$E")
            [ -n "$t1" ] && break
            sleep 0.01
        done
        [ -n "$t1" ] || { echo "round $r: no acknowledged write within 30 s" >&2; exit 1; }
        what="first acknowledged write"
    else
        code=000
        for _ in $(seq 3000); do
            code=$(probe)
            [ "$code" = 200 ] && break
            sleep 0.01
        done
        t1=$(date +%s.%N)
        what="200 through the relay"
    fi
    dt=$(python3 -c "print(f'{$t1-$t0:.3f}')")
    times+=("$dt")
    echo "round $r: killed $L, $what after ${dt} s (now $(leader))"
    start_node "$L"
done
printf '%s\n' "${times[@]}" | python3 -c '
import statistics, sys
t = sorted(float(x) for x in sys.stdin)
print(f"failover over {len(t)} kills (TTL 2 s, '"$([ "$REPLICATED" = 1 ] && echo replicated, to the first acknowledged write || echo control plane, to the first 200)"'): median {statistics.median(t):.2f} s, min {t[0]:.2f} s, max {t[-1]:.2f} s")'
