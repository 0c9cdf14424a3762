#!/usr/bin/env bash
# perf/ha/replication.sh — the cost of replication: replicated confirm and allocate
# throughput against a single node, side by side. Both sides run the same
# release binary with --data-dir (and the same --fsync); the replicated side
# is a leader and its synchronous standby (--ha etcd, --ha-sync strict) on one
# etcd member, all on loopback. loadgen drives the single node and the leader
# ALTERNATELY (single, replicated, single, ...) so that the noise of a shared
# machine hits both alike; medians are printed as one markdown table.
# Everything it starts is killed on exit.
#
# Usage: perf/ha/replication.sh [--rounds N] [--duration S] [--fsync MODE]
#        [--scenarios "confirm allocate"] [--connections N] [--no-build]
#        [--bin PATH]   (another hf3fs-meta binary, e.g. an older build's copy)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
ROOT=$(pwd)
# shellcheck source=perf/lib.sh
source perf/lib.sh
REL=$(perf_bin_dir release)
BIN="$REL/hf3fs-meta"
ROUNDS=3 DURATION=5 WARMUP=1 FSYNC=batch SCENARIOS="confirm allocate" CONNS=32 BUILD=1
while [[ $# -gt 0 ]]; do
  case "$1" in
    --rounds) ROUNDS="$2"; shift ;;
    --duration) DURATION="$2"; shift ;;
    --fsync) FSYNC="$2"; shift ;;
    --scenarios) SCENARIOS="$2"; shift ;;
    --connections) CONNS="$2"; shift ;;
    --no-build) BUILD=0 ;;
    --bin) BIN="$2"; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "replication.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
if [[ $BUILD == 1 ]]; then
  perf_build release --bin hf3fs-meta
  perf_build release -p hf3fs-perf --bin loadgen
fi
command -v etcd >/dev/null || { echo "etcd is not installed (apt-get install etcd-server)" >&2; exit 2; }

WORK=$(mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT INT TERM
wait_http() { for _ in $(seq 200); do curl -fs "http://$1/health" >/dev/null 2>&1 && return 0; sleep 0.05; done; return 1; }

# etcd: one member on loopback.
etcd_one

export HF3FS_META_LOG_LEVEL=${HF3FS_META_LOG_LEVEL:-warn} RUST_LOG=${RUST_LOG:-warn}
start() { # name port extra...
  local name=$1 port=$2; shift 2
  "$BIN" --host 127.0.0.1 --port "$port" --data-dir "$WORK/$name" --fsync "$FSYNC" "$@" \
    >"$WORK/$name.log" 2>&1 &
  PIDS+=($!)
  wait_http "127.0.0.1:$port" || { echo "$name did not start:"; cat "$WORK/$name.log"; exit 1; }
}
SINGLE=$(free_port); start single "$SINGLE"
HA=(--ha etcd --etcd-endpoints "$ETCD_URL" --ha-cluster /perf --ha-token-file "$WORK/token" --ha-sync strict)
PA=$(free_port) PB=$(free_port)
start a "$PA" "${HA[@]}" --node-id a --advertise-url "http://127.0.0.1:$PA"
start b "$PB" "${HA[@]}" --node-id b --advertise-url "http://127.0.0.1:$PB"
LEADER=""
for _ in $(seq 400); do
  for p in "$PA" "$PB"; do
    h=$(curl -fs "http://127.0.0.1:$p/health" || true)
    if [[ $(jq -r '.ha.serving and .ha.replication.in_sync' <<<"$h" 2>/dev/null) == true ]]; then LEADER=$p; fi
  done
  [[ -n $LEADER ]] && break
  sleep 0.05
done
[[ -n $LEADER ]] || { echo "no serving leader with a standby in sync"; tail -5 "$WORK"/a.log "$WORK"/b.log; exit 1; }

run() { # scenario addr label
  "$REL/loadgen" --addr "$2" --scenario "$1" --duration "$DURATION" --warmup "$WARMUP" --connections "$CONNS" \
    --threads 2 --label "$3" --json
}
RES="$WORK/results.jsonl"
for sc in $SCENARIOS; do
  for r in $(seq "$ROUNDS"); do
    run "$sc" "127.0.0.1:$SINGLE" single >>"$RES"
    run "$sc" "127.0.0.1:$LEADER" replicated >>"$RES"
  done
done
echo
echo "commit $(git rev-parse --short HEAD), $(date -u +%F), nproc $(nproc), fsync $FSYNC, $CONNS connections, batch 128, $ROUNDS × ${DURATION}s"
echo
echo "| scenario | single req/s | replicated req/s | ratio | single p50/p99 µs | replicated p50/p99 µs | errors |"
echo "|---|---|---|---|---|---|---|"
python3 - "$RES" "$SCENARIOS" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
for sc in sys.argv[2].split():
    def med(label, k):
        v = [r[k] for r in rows if r["scenario"] == sc and r["label"] == label]
        return statistics.median(v) if v else float("nan")
    err = sum(r["http_errors"] + r["conn_errors"] + r["violations"] for r in rows if r["scenario"] == sc)
    s, p = med("single", "rps"), med("replicated", "rps")
    print(f"| {sc} | {s:,.0f} | {p:,.0f} | {p / s:.2f} | {med('single','p50_us'):.0f}/{med('single','p99_us'):.0f} "
          f"| {med('replicated','p50_us'):.0f}/{med('replicated','p99_us'):.0f} | {err} |")
PY
