#!/usr/bin/env bash
# perf/ha/tls_cost.sh — what TLS costs on the relay-to-leader hop and on the
# replication stream, side by side with the same cluster in plain TCP.
#
# Method: one etcd member (plain: the etcd hop is not measured); two
# replicated pairs of the given binary (--data-dir, --workers 1, --ha-sync
# strict), one plain and one with mutual TLS on its ports and its stream
# (--tls-cert/--tls-key/--tls-client-ca, certificates made now with
# openssl, never kept), each behind its own relay (the TLS one with its
# client certificate). loadgen sends keep-alive requests to each relay in
# plain HTTP, as an engine does.
#
# --mode instructions (default): every node and both relays run under
#   `valgrind --tool=callgrind`; per scenario and cluster, a warm-up run,
#   then the counters are zeroed (callgrind_control -z), --requests timed
#   requests on one connection, and the counters dumped: instructions per
#   request on the relay, the leader and the standby. Deterministic: it
#   repeats on a loaded machine.
#   --request-path-only counts, on the relay, only what runs inside its
#   `forward` (the copy both ways, TLS included), with callgrind's
#   --toggle-collect: its background (the etcd watch) is left out, so the
#   relay's figure is the per-request cost itself. The leader and the
#   standby then count (nearly) nothing: no pattern found yet covers the
#   leader's whole request path (hyper polls the route outside the
#   server module's frames), so their figures are not measured this way.
# --mode wall: no valgrind; per scenario, alternating rounds of
#   --seconds on --connections keep-alive connections through each relay:
#   p50 latency and requests/s (meaningful only on a quiet machine).
#
# Usage: perf/ha/tls_cost.sh [--mode instructions|wall] [--requests N] [--warmup-requests N]
#        [--scenarios "exists confirm"] [--rounds N] [--seconds S] [--connections C]
#        [--bin PATH] [--loadgen PATH] [--request-path-only]
# Needs etcd, openssl, curl, jq, valgrind (instructions mode). Loopback
# only; everything it starts is killed on exit.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
ROOT=$(pwd)
BIN="" LOADGEN=""
MODE=instructions N=300 WARM=1000 SCENARIOS="exists confirm" ROUNDS=3 SECONDS_PER=5 CONNS=8 TOGGLE=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --mode) MODE="$2"; shift ;;
    --requests) N="$2"; shift ;;
    --warmup-requests) WARM="$2"; shift ;;
    --scenarios) SCENARIOS="$2"; shift ;;
    --rounds) ROUNDS="$2"; shift ;;
    --seconds) SECONDS_PER="$2"; shift ;;
    --connections) CONNS="$2"; shift ;;
    --bin) BIN="$2"; shift ;;
    --loadgen) LOADGEN="$2"; shift ;;
    --request-path-only) TOGGLE=(--toggle-collect='*relay::forward*') ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "tls_cost.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
# Instruction counts are the ci build's (as CI's gate), wall-clock figures
# the release build's (perf/README.md).
[[ $MODE == instructions ]] && profile=ci || profile=release
BIN=${BIN:-$ROOT/target/$profile/hf3fs-meta} LOADGEN=${LOADGEN:-$ROOT/target/$profile/loadgen}
need=(etcd openssl curl jq)
[[ $MODE == instructions ]] && need+=(valgrind callgrind_control)
for t in "${need[@]}"; do
  command -v "$t" >/dev/null || { echo "tls_cost.sh: needs $t" >&2; exit 2; }
done
[[ -x $BIN && -x $LOADGEN ]] || {
  echo "build first: cargo build --profile $profile --bin hf3fs-meta && cargo build --profile $profile -p hf3fs-perf --bin loadgen" >&2
  exit 2
}

WORK=$(mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT INT TERM
# shellcheck source=perf/lib.sh
source perf/lib.sh
etcd_one

# A CA, the nodes' certificate (server and client, for 127.0.0.1) and the
# relay's client certificate.
ec() { openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "$@" 2>/dev/null; }
ec -x509 -days 2 -subj /CN=tls-cost-ca -keyout "$WORK/ca.key" -out "$WORK/ca.pem"
for who in node relay; do
  ec -subj "/CN=$who" -keyout "$WORK/$who.key" -out "$WORK/$who.csr"
  printf 'subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n' >"$WORK/$who.ext"
  openssl x509 -req -in "$WORK/$who.csr" -CA "$WORK/ca.pem" -CAkey "$WORK/ca.key" -CAcreateserial -days 2 \
    -extfile "$WORK/$who.ext" -out "$WORK/$who.pem" 2>/dev/null
done
CURL_TLS=(--cacert "$WORK/ca.pem" --cert "$WORK/node.pem" --key "$WORK/node.key")

export HF3FS_META_LOG_LEVEL=warn RUST_LOG=warn
declare -A PID_OF
run() { # name command...
  local name=$1; shift
  if [[ $MODE == instructions ]]; then
    valgrind --tool=callgrind "${TOGGLE[@]}" --callgrind-out-file="$WORK/$name.cg" "$@" >"$WORK/$name.log" 2>&1 &
  else
    "$@" >"$WORK/$name.log" 2>&1 &
  fi
  PIDS+=($!)
  PID_OF[$name]=$!
}
HA=(--ha etcd --etcd-endpoints "$ETCD_URL" --ha-token-file "$WORK/token" --ha-sync strict --ha-sync-timeout-ms 60000)
TLS=(--tls-cert "$WORK/node.pem" --tls-key "$WORK/node.key" --tls-client-ca "$WORK/ca.pem")
declare -A PORT
for name in pa pb ta tb; do PORT[$name]=$(free_port); done
for name in pa pb; do
  run "$name" "$BIN" --host 127.0.0.1 --port "${PORT[$name]}" --workers 1 --data-dir "$WORK/$name" "${HA[@]}" \
    --ha-cluster /perf-plain --node-id "$name" --advertise-url "http://127.0.0.1:${PORT[$name]}"
done
for name in ta tb; do
  run "$name" "$BIN" --host 127.0.0.1 --port "${PORT[$name]}" --workers 1 --data-dir "$WORK/$name" "${HA[@]}" \
    --ha-cluster /perf-tls --node-id "$name" --advertise-url "https://127.0.0.1:${PORT[$name]}" "${TLS[@]}"
done
RP=$(free_port) RT=$(free_port)
run rp "$BIN" relay --listen "127.0.0.1:$RP" --etcd-endpoints "$ETCD_URL" --ha-cluster /perf-plain
run rt "$BIN" relay --listen "127.0.0.1:$RT" --etcd-endpoints "$ETCD_URL" --ha-cluster /perf-tls \
  --tls-ca "$WORK/ca.pem" --tls-cert "$WORK/relay.pem" --tls-key "$WORK/relay.key"

health() { # name → /health JSON
  if [[ $1 == t* ]]; then curl -fs -m 5 "${CURL_TLS[@]}" "https://127.0.0.1:${PORT[$1]}/health"
  else curl -fs -m 5 "http://127.0.0.1:${PORT[$1]}/health"; fi
}
declare -A LEADER STANDBY
for c in p t; do
  for _ in $(seq 2400); do
    for name in "${c}a" "${c}b"; do
      if [[ $(health "$name" 2>/dev/null | jq -r '.ha.serving and .ha.replication.in_sync' 2>/dev/null) == true ]]; then
        LEADER[$c]=$name
      fi
    done
    [[ -n ${LEADER[$c]:-} ]] && break
    sleep 0.05
  done
  [[ -n ${LEADER[$c]:-} ]] || { echo "cluster $c: no serving leader with a standby in sync"; tail -5 "$WORK"/*.log; exit 1; }
  if [[ ${LEADER[$c]} == "${c}a" ]]; then STANDBY[$c]=${c}b; else STANDBY[$c]=${c}a; fi
done
# The relays answer once they follow their leader.
for r in "$RP" "$RT"; do
  for _ in $(seq 2400); do curl -fs -m 5 "http://127.0.0.1:$r/health" | grep -q '"role":"leader"' && break; sleep 0.05; done
done

total() { awk '/^(summary|totals):/ {print $2; exit}' "$1"; }
scenario() { [[ $1 == exists ]] && echo exists || echo "$1"; }
loadgen() { # relay-port connections extra...
  local port=$1 conns=$2; shift 2
  "$LOADGEN" --addr "127.0.0.1:$port" --connections "$conns" --threads 1 "$@"
}

echo
echo "commit $(git rev-parse --short HEAD), $(date -u +%F), mode $MODE, batch 128, --workers 1, --fsync batch"
echo
if [[ $MODE == instructions ]]; then
  echo "Instructions per timed request ($N requests on one keep-alive connection, after $WARM warm-up requests)."
  echo
  echo "| scenario | hop | relay | leader | standby | relay + leader + standby |"
  echo "|---|---|---:|---:|---:|---:|"
  for sc in $SCENARIOS; do
    for c in p t; do
      relay=r$c leader=${LEADER[$c]} standby=${STANDBY[$c]} port=$([[ $c == p ]] && echo "$RP" || echo "$RT")
      loadgen "$port" 1 --scenario "$(scenario "$sc")" --duration 600 --max-requests "$WARM" >/dev/null
      for name in "$relay" "$leader" "$standby"; do callgrind_control -z "${PID_OF[$name]}" >/dev/null 2>&1; done
      loadgen "$port" 1 --scenario "$(scenario "$sc")" --duration 600 --max-requests "$N" --json --label "$c" \
        >"$WORK/$sc-$c.json"
      row=()
      for name in "$relay" "$leader" "$standby"; do
        callgrind_control --dump="$sc-$c" "${PID_OF[$name]}" >/dev/null 2>&1
        f=""
        for _ in $(seq 600); do
          f=$(ls -t "$WORK/$name.cg".* 2>/dev/null | head -1 || true)
          [[ -n $f && -s $f ]] && grep -q '^totals:' "$f" && break
          sleep 0.1
        done
        row+=("$(total "$f")")
        mv "$f" "$WORK/$name.cg-$sc"
      done
      n=$(jq .requests "$WORK/$sc-$c.json")
      python3 - "$sc" "$c" "$n" "${row[@]}" <<'PY'
import sys
sc, c, n, *t = sys.argv[1:]
per = [int(x) / int(n) for x in t]
hop = "plain" if c == "p" else "mutual TLS"
print(f"| {sc} | {hop} | {per[0]:,.0f} | {per[1]:,.0f} | {per[2]:,.0f} | {sum(per):,.0f} |")
PY
    done
  done
else
  echo "Wall clock, $CONNS keep-alive connections through each relay, $ROUNDS alternating rounds of ${SECONDS_PER} s;"
  echo "median of the rounds' p50 and requests/s (load average at start: $(cut -d' ' -f1-3 /proc/loadavg))."
  echo
  echo "| scenario | hop | p50 µs | requests/s |"
  echo "|---|---|---:|---:|"
  for sc in $SCENARIOS; do
    for i in $(seq "$ROUNDS"); do
      for c in p t; do
        port=$([[ $c == p ]] && echo "$RP" || echo "$RT")
        loadgen "$port" "$CONNS" --scenario "$(scenario "$sc")" --duration "$SECONDS_PER" --json --label "$c" \
          >"$WORK/wall-$sc-$c-$i.json"
      done
    done
    for c in p t; do
      python3 - "$sc" "$c" "$WORK"/wall-"$sc"-"$c"-*.json <<'PY'
import json, statistics, sys
sc, c, *files = sys.argv[1:]
runs = [json.load(open(f)) for f in files]
def pick(r, *names):
    for n in names:
        v = r
        for part in n.split("."):
            v = v.get(part) if isinstance(v, dict) else None
        if v is not None:
            return float(v)
    raise SystemExit(f"no {names} in {r.keys()}")
p50 = statistics.median(pick(r, "latency_us.p50", "p50_us", "latency.p50_us") for r in runs)
rps = statistics.median(pick(r, "throughput", "requests_per_second", "rps") for r in runs)
hop = "plain" if c == "p" else "mutual TLS"
print(f"| {sc} | {hop} | {p50:,.0f} | {rps:,.0f} |")
PY
    done
  done
fi
