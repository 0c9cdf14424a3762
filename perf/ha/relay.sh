#!/usr/bin/env bash
# perf/ha/relay.sh — `hf3fs-meta relay` beside a direct connection and socat
# (nodelay both sides), side by side in one run: the latency a relay adds on
# one keep-alive connection, the throughput at 32 connections with the relay
# on a core of its own, and the relay's CPU per request.
#
# One etcd member and one leader (`--ha etcd --ha-promote-without-state`,
# one worker) on loopback; the relay and socat forward to it. The leader and
# the load generator are pinned to CPU 0, the relay and socat to CPU 1
# (`taskset`), so that the forwarder has a core of its own. Each round runs,
# for each path in turn (direct, relay, socat): `loadgen --connections 1`
# (p50 latency) and `loadgen --connections 32` (req/s), `batch_exists` of
# 128 stored keys. The relay's CPU (utime + stime from /proc) is counted
# over its 32-connection runs (and its one-connection runs) and divided by
# their requests (scaled to the warm-up's half second the count includes). Medians of the
# rounds are printed as a markdown table.
#
# Two variants test where a forwarder's one-connection latency goes (the
# time between a request's bytes and the wake-up of the process that reads
# them): `--forwarder-cpu 0` puts the relay and socat on CPU 0 with the
# leader and the load generator, so that no hop of a request wakes another
# CPU; `--spin` keeps both CPUs busy with a spinner at nice 19 each, so
# that a wake-up finds its CPU running (a spinner yields to any woken
# process) instead of halted. The forwarder CPU per request is counted in
# both, and includes no spinner. `--perf DIR` records the relay with
# `perf record -e cpu-clock -g` over its one-connection runs
# (DIR/relay-1conn.data, read with `perf report -i`): where its own time
# per request goes, user and kernel.
#
# Usage: perf/ha/relay.sh [--no-build] [--rounds N] [--duration S] [--bin PATH] [--loadgen PATH]
#          [--forwarder-cpu N] [--spin] [--perf DIR]
# Loopback only; bounded by rounds × 6 × (duration + 1) seconds; everything
# started is stopped on exit.
set -euo pipefail
shopt -s inherit_errexit
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
# shellcheck source=perf/lib.sh
source perf/lib.sh
ROUNDS=3 DURATION=3 BUILD=1 BIN=target/release/hf3fs-meta LOADGEN=target/release/loadgen FWD=1 SPIN=0 PERFDIR=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --no-build) BUILD=0 ;;
    --rounds) ROUNDS="$2"; shift ;;
    --duration) DURATION="$2"; shift ;;
    --bin) BIN="$2"; BUILD=0; shift ;;
    --loadgen) LOADGEN="$2"; shift ;;
    --forwarder-cpu) FWD="$2"; shift ;;
    --spin) SPIN=1 ;;
    --perf) PERFDIR="$2"; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "relay.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
if [ "$BUILD" = 1 ]; then
  perf_build release -q -p hf3fs-meta --bin hf3fs-meta
  perf_build release -q -p hf3fs-perf --bin loadgen
fi
command -v socat >/dev/null || { echo "relay.sh: needs socat" >&2; exit 2; }
CPUS=$(nproc)
# `$(pinned N) cmd ...`: cmd on CPU N (taskset execs it, so `$!` is its pid).
pinned() { if [ "$CPUS" -ge 2 ]; then echo taskset -c "$1"; fi; }
pin() { $(pinned "$1") "${@:2}"; }

WORK=$(mktemp -d /tmp/hf3fs-relay.XXXXXX)
PIDS=()
# socat's children (one per connection) end with their connections.
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT
etcd_one

LP=$(free_port) RP=$(free_port) SP=$(free_port)
RUST_LOG=warn $(pinned 0) "$BIN" --host 127.0.0.1 --port "$LP" --workers 1 --ha etcd --etcd-endpoints "$ETCD_URL" \
  --ha-cluster /perf --node-id a --advertise-url "http://127.0.0.1:$LP" --ha-lease-ttl 2 \
  --ha-token-file "$WORK/token" --ha-promote-without-state >"$WORK/leader.log" 2>&1 &
PIDS+=($!)
RUST_LOG=warn $(pinned "$FWD") "$BIN" relay --listen "127.0.0.1:$RP" --etcd-endpoints "$ETCD_URL" --ha-cluster /perf \
  --ha-lease-ttl 2 >"$WORK/relay.log" 2>&1 &
RELAY=$!
PIDS+=($RELAY)
$(pinned "$FWD") socat "TCP-LISTEN:$SP,fork,reuseaddr,nodelay,bind=127.0.0.1" "TCP:127.0.0.1:$LP,nodelay" >/dev/null 2>&1 &
PIDS+=($!)
# Serving through the relay: the leader is elected and the relay follows it.
for _ in $(seq 300); do
  curl -fs -o /dev/null -X POST -H 'Content-Type: application/json' -d '{"keys":[]}' \
    "http://127.0.0.1:$RP/keys/batch_exists" && break
  sleep 0.1
done
pin 0 "$LOADGEN" --addr "127.0.0.1:$LP" --scenario exists --setup-only >/dev/null

if [ "$SPIN" = 1 ]; then
  for c in $(seq 0 $((CPUS - 1))); do
    $(pinned "$c") nice -n 19 sh -c 'while :; do :; done' &
    PIDS+=($!)
  done
fi

ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
TICK=$(getconf CLK_TCK)
field() { python3 -c "import json,sys; print(json.loads(sys.stdin.read())['$1'])"; }
declare -A P50 RPS CPU CPU1
for r in $(seq "$ROUNDS"); do
  for path in direct relay socat; do
    case $path in direct) port=$LP ;; relay) port=$RP ;; socat) port=$SP ;; esac
    before=$(ticks "$RELAY") rec=""
    if [ "$path" = relay ] && [ -n "$PERFDIR" ]; then
      mkdir -p "$PERFDIR"
      perf record -q -e cpu-clock -g -p "$RELAY" -o "$PERFDIR/relay-1conn-$r.data" 2>/dev/null &
      rec=$!
    fi
    one=$(pin 0 "$LOADGEN" --addr "127.0.0.1:$port" --scenario exists --no-setup --connections 1 \
      --duration "$DURATION" --warmup 0.5 --json)
    [ -n "$rec" ] && { kill -INT "$rec"; wait "$rec" || true; }
    after=$(ticks "$RELAY")
    P50[$path]+="$(field p50_us <<<"$one") "
    if [ "$path" = relay ]; then
      n=$(field requests <<<"$one")
      CPU1[$path]+="$(python3 -c "print(($after - $before) / $TICK * 1e6 / max($n * ($DURATION + 0.5) / $DURATION, 1))") "
    fi
    before=$(ticks "$RELAY")
    many=$(pin 0 "$LOADGEN" --addr "127.0.0.1:$port" --scenario exists --no-setup --connections 32 \
      --duration "$DURATION" --warmup 0.5 --json)
    after=$(ticks "$RELAY")
    RPS[$path]+="$(field rps <<<"$many") "
    if [ "$path" = relay ]; then
      n=$(field requests <<<"$many")
      CPU[$path]+="$(python3 -c "print(($after - $before) / $TICK * 1e6 / max($n * ($DURATION + 0.5) / $DURATION, 1))") "
    fi
  done
done
med() { python3 -c "import statistics,sys; v=[float(x) for x in sys.argv[1:]]; print(statistics.median(v))" "$@"; }
d50=$(med ${P50[direct]}) drps=$(med ${RPS[direct]})
spun=""; [ "$SPIN" = 1 ] && spun="; a spinner at nice 19 on every CPU"
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg); $ROUNDS rounds of ${DURATION} s; relay and socat on CPU $FWD, leader and loadgen on CPU 0$spun"
echo
echo "| path | p50, 1 connection (µs) | added (µs) | req/s, 32 connections | × direct | relay CPU µs/request (1 conn) | relay CPU µs/request (32 conns) | p50 rounds | req/s rounds |"
echo "|---|---:|---:|---:|---:|---:|---:|---|---|"
for path in direct relay socat; do
  p=$(med ${P50[$path]}) q=$(med ${RPS[$path]})
  cpu=${CPU[$path]:-} cpu1=${CPU1[$path]:-}
  [ -n "$cpu" ] && cpu=$(med $cpu) || cpu="–"
  [ -n "$cpu1" ] && cpu1=$(med $cpu1) || cpu1="–"
  python3 -c "
p, q, d50, drps = $p, $q, $d50, $drps
cpu, cpu1 = ('$cpu', '$cpu1')
cpu, cpu1 = (c if c == '–' else f'{float(c):.1f}' for c in (cpu, cpu1))
print(f'| $path | {p:.0f} | {p - d50:+.0f} | {q:,.0f} | {q / drps:.2f} | {cpu1} | {cpu} | ${P50[$path]}| ${RPS[$path]}|')"
done
