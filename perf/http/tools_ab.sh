#!/usr/bin/env bash
# perf/http/tools_ab.sh --before DIR --after DIR [--server BIN] [--rounds N]
#
# Do two builds of the client tools give the same figures against one
# server? DIR is a build's binaries directory (e.g. target/ci of each
# tree) holding `hf3fs-meta` (whose `bench` subcommand is the open-loop
# benchmark) and `loadgen`. Each round runs, on a fresh server each time
# (--server, default the --after build's hf3fs-meta, so only the tool
# differs):
#
#   loadgen --scenario exists --connections 32 --duration 3
#   hf3fs-meta bench --mode open --rate 100 --duration 5 --engines 2 --tp 4
#
# each under /usr/bin/time, so that beside its own figures the tool's CPU
# (user + system) per request, or per prompt, is known: on a machine others
# load, req/s and latency move with their load, a tool's CPU per request
# much less.
#
# once with each build, the order alternating round by round (before
# first on odd rounds, after first on even ones), so that a machine loaded
# by others drifts both alike. Prints one TSV line per run (round, build,
# tool, figures) and, per figure, the median over the rounds of the ratio
# after / before of the same round.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source perf/lib.sh

BEFORE="" AFTER="" SERVER="" ROUNDS=5
while [[ $# -gt 0 ]]; do
  case $1 in
    --before) BEFORE=$2; shift 2 ;;
    --after) AFTER=$2; shift 2 ;;
    --server) SERVER=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    *) log "unknown flag $1"; exit 2 ;;
  esac
done
[[ -n $BEFORE && -n $AFTER ]] || { log "usage: $0 --before DIR --after DIR [--server BIN] [--rounds N]"; exit 2; }
SERVER=${SERVER:-$AFTER/hf3fs-meta}
for b in "$BEFORE/hf3fs-meta" "$BEFORE/loadgen" "$AFTER/hf3fs-meta" "$AFTER/loadgen" "$SERVER"; do
  [[ -x $b ]] || { log "$b: not built"; exit 2; }
done

WORK=$(mktemp -d)
SPID=""
cleanup() { [[ -n $SPID ]] && kill "$SPID" 2>/dev/null; wait 2>/dev/null; rm -rf "$WORK"; }
trap cleanup EXIT

# serve: a fresh in-memory server on a free port; sets PORT and SPID.
serve() {
  PORT=$(free_port)
  "$SERVER" --host 127.0.0.1 --port "$PORT" >"$WORK/server.log" 2>&1 &
  SPID=$!
  wait_port "$PORT" || { log "the server did not listen"; cat "$WORK/server.log" >&2; exit 1; }
}
unserve() { kill "$SPID"; wait "$SPID" 2>/dev/null || true; SPID=""; }

# run BUILD_NAME DIR: one loadgen run and one bench run with DIR's tools.
run() {
  local name=$1 dir=$2
  serve
  /usr/bin/time -f '%U %S' -o "$WORK/lg.time" \
    "$dir/loadgen" --addr "127.0.0.1:$PORT" --scenario exists --connections 32 --duration 3 --json >"$WORK/lg.json"
  unserve
  python3 - "$WORK/lg.json" "$r" "$name" "$WORK/lg.time" <<'PY'
import json, sys
j = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
cpu = sum(map(float, open(sys.argv[4]).read().split()[-2:]))
print("\t".join([sys.argv[2], sys.argv[3], "loadgen", f"rps={j['rps']}", f"p50_us={j['p50_us']}", f"p99_us={j['p99_us']}",
                 f"cpu_us_per_request={cpu * 1e6 / max(j['requests'], 1):.2f}"]))
PY
  serve
  /usr/bin/time -f '%U %S' -o "$WORK/bench.time" \
    "$dir/hf3fs-meta" bench --target "127.0.0.1:$PORT" --mode open --rate 100 --duration 5 --engines 2 --tp 4 --json \
    >"$WORK/bench.json"
  unserve
  python3 - "$WORK/bench.json" "$r" "$name" "$WORK/bench.time" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
cpu = sum(map(float, open(sys.argv[4]).read().split()[-2:]))
p = j["prompts"]
lat = p["latency_us"] or {}
ex = (j["routes"].get("batch_exists") or {}).get("latency_us") or {}
print("\t".join([sys.argv[2], sys.argv[3], "bench", f"prompts_per_s={p['per_second']}", f"prompt_p50_us={lat.get('p50')}",
                 f"prompt_p99_us={lat.get('p99')}", f"exists_p50_us={ex.get('p50')}", f"hit_rate={j['hit_rate']}",
                 f"cpu_us_per_prompt={cpu * 1e6 / max(p['done'], 1):.1f}"]))
PY
}

for r in $(seq 1 "$ROUNDS"); do
  if (( r % 2 )); then
    run before "$BEFORE" | tee -a "$WORK/runs"; run after "$AFTER" | tee -a "$WORK/runs"
  else
    run after "$AFTER" | tee -a "$WORK/runs"; run before "$BEFORE" | tee -a "$WORK/runs"
  fi
done

python3 - "$WORK/runs" <<'PY'
import statistics, sys
from collections import defaultdict
runs = defaultdict(dict)  # (round, tool) -> build -> {figure: value}
for line in open(sys.argv[1]):
    r, build, tool, *figs = line.rstrip("\n").split("\t")
    runs[(r, tool)][build] = {k: float(v) for k, v in (f.split("=") for f in figs) if v != "None"}
ratios = defaultdict(list)
for (r, tool), b in runs.items():
    for k, v in b["before"].items():
        if k in b["after"] and v:
            ratios[(tool, k)].append(b["after"][k] / v)
print("\ntool\tfigure\tmedian after/before\tratios by round")
for (tool, k), rs in sorted(ratios.items()):
    print(f"{tool}\t{k}\t{statistics.median(rs):.3f}\t" + " ".join(f"{x:.3f}" for x in rs))
PY
