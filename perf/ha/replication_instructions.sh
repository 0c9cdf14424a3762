#!/usr/bin/env bash
# perf/ha/replication_instructions.sh — the cost of replication: what one replicated
# request costs, in instructions, on the leader AND on its synchronous
# standby, against a single node's, counted by callgrind (deterministic:
# it repeats on a loaded machine where req/s and CPU seconds do not).
#
# Method: one etcd member; three servers of the release binary, each with
# --data-dir, --workers 1 and the same --fsync, each under
# `valgrind --tool=callgrind`: a single node, and a leader with its
# synchronous standby (--ha etcd --ha-sync strict, a 60 s acknowledgement
# wait so valgrind's slowness never times out). For each scenario, loadgen
# (one connection) first warms every route up (--warmup-requests: the key
# index grows its arena over the first thousands of fresh keys, which would
# otherwise dominate the count), then callgrind's counters of
# all three processes are zeroed (callgrind_control -z), loadgen sends
# --requests timed requests (with the scenario's untimed ones: confirm's
# allocate and release) to the single node, the counters are dumped
# (callgrind_control -d), and the same again against the leader.
# Instructions per timed request = the interval's total / timed requests.
# Everything it starts is killed on exit.
#
# Usage: perf/ha/replication_instructions.sh [--requests N] [--warmup-requests N] [--fsync MODE]
#        [--scenarios "confirm allocate"] [--bin PATH] [--keep DIR]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
ROOT=$(pwd)
# Instruction counts are the ci build's, as CI's gate (perf/README.md).
BIN="$ROOT/target/ci/hf3fs-meta" LOADGEN="$ROOT/target/ci/loadgen"
N=300 WARM=3000 FSYNC=batch SCENARIOS="confirm allocate" KEEP=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --requests) N="$2"; shift ;;
    --warmup-requests) WARM="$2"; shift ;;
    --fsync) FSYNC="$2"; shift ;;
    --scenarios) SCENARIOS="$2"; shift ;;
    --bin) BIN="$2"; shift ;;
    --keep) KEEP="$2"; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "replication_instructions.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
for t in etcd valgrind callgrind_control jq; do
  command -v "$t" >/dev/null || { echo "replication_instructions.sh: needs $t" >&2; exit 2; }
done
[[ -x $BIN && -x $LOADGEN ]] || { echo "build first: cargo build --profile ci --bin hf3fs-meta; cargo build --profile ci -p hf3fs-perf --bin loadgen" >&2; exit 2; }

WORK=$(mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; [[ -n $KEEP ]] && { mkdir -p "$KEEP"; cp "$WORK"/*.cg* "$KEEP"/ 2>/dev/null || true; }; rm -rf "$WORK"; }
trap cleanup EXIT INT TERM
wait_http() { for _ in $(seq 1200); do curl -fs "http://$1/health" >/dev/null 2>&1 && return 0; sleep 0.05; done; return 1; }

# shellcheck source=perf/lib.sh
source perf/lib.sh
etcd_one

export HF3FS_META_LOG_LEVEL=warn RUST_LOG=warn
declare -A PID_OF
start() { # name port extra...
  local name=$1 port=$2; shift 2
  valgrind --tool=callgrind --callgrind-out-file="$WORK/$name.cg" \
    "$BIN" --host 127.0.0.1 --port "$port" --workers 1 --data-dir "$WORK/$name" --fsync "$FSYNC" "$@" \
    >"$WORK/$name.log" 2>&1 &
  PIDS+=($!)
  PID_OF[$name]=$!
  wait_http "127.0.0.1:$port" || { echo "$name did not start:"; cat "$WORK/$name.log"; exit 1; }
}
SINGLE=$(free_port); start single "$SINGLE"
HA=(--ha etcd --etcd-endpoints "$ETCD_URL" --ha-cluster /perf --ha-token-file "$WORK/token"
    --ha-sync strict --ha-sync-timeout-ms 60000)
PA=$(free_port) PB=$(free_port)
start a "$PA" "${HA[@]}" --node-id a --advertise-url "http://127.0.0.1:$PA"
start b "$PB" "${HA[@]}" --node-id b --advertise-url "http://127.0.0.1:$PB"
LEADER="" STANDBY=""
for _ in $(seq 1200); do
  for p in "$PA" "$PB"; do
    h=$(curl -fs "http://127.0.0.1:$p/health" || true)
    if [[ $(jq -r '.ha.serving and .ha.replication.in_sync' <<<"$h" 2>/dev/null) == true ]]; then LEADER=$p; fi
  done
  [[ -n $LEADER ]] && break
  sleep 0.05
done
[[ -n $LEADER ]] || { echo "no serving leader with a standby in sync"; tail -5 "$WORK"/a.log "$WORK"/b.log; exit 1; }
if [[ $LEADER == "$PA" ]]; then LNAME=a SNAME=b; else LNAME=b SNAME=a; fi

total() { # callgrind output file → its instruction total
  awk '/^(summary|totals):/ {print $2; exit}' "$1"
}
arena() { # callgrind output file → the instructions of the key index's arena growth in it
  callgrind_annotate --inclusive=yes --threshold=100 --auto=no "$1" 2>/dev/null |
    awk '/Arena::fresh \[/ {gsub(",", "", $1); print $1; f=1; exit} END {if (!f) print 0}'
}
# Counts of all three processes over one loadgen run against $2.
measure() { # scenario port label
  local sc=$1 port=$2 label=$3 name
  "$LOADGEN" --addr "127.0.0.1:$port" --scenario "$sc" --connections 1 --threads 1 --duration 300 \
    --max-requests "$WARM" >/dev/null
  for name in single a b; do callgrind_control -z "${PID_OF[$name]}" >/dev/null 2>&1; done
  "$LOADGEN" --addr "127.0.0.1:$port" --scenario "$sc" --connections 1 --threads 1 --duration 300 \
    --max-requests "$N" --json --label "$label" >"$WORK/$sc-$label.json"
  for name in single a b; do callgrind_control --dump="$label-$sc" "${PID_OF[$name]}" >/dev/null 2>&1; done
  local n
  n=$(jq .requests "$WORK/$sc-$label.json")
  printf '%s %s %s' "$sc" "$label" "$n"
  for name in single "$LNAME" "$SNAME"; do
    local f=""
    for _ in $(seq 600); do
      f=$(ls -t "$WORK/$name.cg".* 2>/dev/null | head -1 || true)
      [[ -n $f && -s $f ]] && grep -q '^totals:' "$f" && break
      sleep 0.1
    done
    printf ' %s %s' "$(total "$f")" "$(arena "$f")"
    mv "$f" "$WORK/$name.cg-$label-$sc"
  done
  echo
}
echo
echo "commit $(git rev-parse --short HEAD), $(date -u +%F), fsync $FSYNC, 1 connection, batch 128, --workers 1, $N requests (all kinds) per run"
echo
echo "Instructions per timed request; in brackets, without the key index's arena growth (Arena::fresh:"
echo "zeroed arena chunks, a cost that comes in steps every few thousand fresh keys, on every node alike)."
echo
echo "| scenario | single | replicated: leader | replicated: standby | leader + standby / single |"
echo "|---|---:|---:|---:|---:|"
for sc in $SCENARIOS; do
  s=$(measure "$sc" "$SINGLE" single)
  r=$(measure "$sc" "$LEADER" replicated)
  python3 - "$s" "$r" <<'PY'
import sys
s, r = (a.split() for a in sys.argv[1:])
n_s, n_r = int(s[2]), int(r[2])
# fields: scenario label n, then (total, arena) for single, leader, standby
single = (int(s[3]) / n_s, (int(s[3]) - int(s[4])) / n_s)
leader = (int(r[5]) / n_r, (int(r[5]) - int(r[6])) / n_r)
standby = (int(r[7]) / n_r, (int(r[7]) - int(r[8])) / n_r)
cell = lambda v: f"{v[0]:,.0f} ({v[1]:,.0f})"
ratio = f"{(leader[0] + standby[0]) / single[0]:.2f} ({(leader[1] + standby[1]) / single[1]:.2f})"
print(f"| {s[0]} | {cell(single)} | {cell(leader)} | {cell(standby)} | {ratio} |")
PY
done
