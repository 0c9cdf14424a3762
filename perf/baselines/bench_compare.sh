#!/usr/bin/env bash
# perf/baselines/bench_compare.sh — one comparison made with `hf3fs-meta bench`:
# hf3fs-meta against vLLM's own Python metadata server, the same cluster
# shape and the same prompts (same seed), runs alternated so that the noise
# of a shared machine hits both alike.
#
# vLLM's server is brought up as perf/baselines/vllm.sh does (a scratch venv
# made at run time, the module read out of the vllm wheel, deleted on exit;
# its code never enters this repository). Both servers listen on free
# loopback ports; every bench run is bounded by --duration and --drain.
#
# Usage: perf/baselines/bench_compare.sh [--bin PATH] [--rounds N] [--out DIR] [-- bench flags]
#   --bin     the hf3fs-meta binary (default target/release/hf3fs-meta, built with
#             `cargo build --release --bin hf3fs-meta` if missing: a
#             wall-clock comparison, perf/README.md); it is
#             both the server and the bench
#   --rounds  alternations per scenario (default 2)
#   --out     where the JSON reports and SVG charts go (default perf/out/bench-compare)
# Bench flags after `--` replace the default cluster shape below.
# Environment: VLLM_VERSION, VLLM_WHEEL as for perf/baselines/vllm.sh.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
# shellcheck source=perf/lib.sh
source perf/lib.sh
BIN=target/release/hf3fs-meta
ROUNDS=2
OUT=perf/out/bench-compare
SHAPE=(--engines 2 --tp 4 --block-tokens 64 --prompt-tokens 2048 --pages-per-rank 65536 --seed 1)
while [[ $# -gt 0 ]]; do
  case $1 in
    --bin) BIN=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --) shift; SHAPE=("$@"); break ;;
    *) echo "unknown option $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
[[ -x "$BIN" ]] || perf_build release --bin hf3fs-meta
mkdir -p "$OUT"

VERSION=${VLLM_VERSION:-0.33.0}
MODULE=vllm/distributed/kv_transfer/kv_connector/v1/hf3fs/hf3fs_metadata_server.py
# shellcheck source=perf/baselines/engine_server.sh
source perf/baselines/engine_server.sh
pybase_init bench_compare.sh
WHEEL=${VLLM_WHEEL:-}
if [[ -z "$WHEEL" ]]; then
  "$PY" -m pip download -q --disable-pip-version-check --no-deps -d "$TMP/wheel" "vllm==$VERSION"
  WHEEL=$(ls "$TMP"/wheel/vllm-*.whl)
fi
"$PY" - "$WHEEL" "$MODULE" "$TMP/hf3fs_metadata_server.py" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    open(sys.argv[3], "wb").write(z.read(sys.argv[2]))
PY
pybase_start "$TMP" "$PY" -c "import sys, uvicorn, hf3fs_metadata_server as m
uvicorn.run(m.Hf3fsMetadataServer().app, host='127.0.0.1', port=int(sys.argv[1]), access_log=False, log_level='warning')" "$PORT"
VLLM_PORT=$PORT
log "vLLM $(basename "$WHEEL" | cut -d- -f2)'s metadata server on 127.0.0.1:$VLLM_PORT"

OURS_PORT=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
HF3FS_META_LOG_LEVEL=warn timeout 3600 "$BIN" --host 127.0.0.1 --port "$OURS_PORT" >"$TMP/ours.log" 2>&1 &
OURS_PID=$!
trap 'kill -TERM $OURS_PID 2>/dev/null || true; pybase_cleanup' EXIT
for _ in $(seq 1 100); do
  (exec 3<>"/dev/tcp/127.0.0.1/$OURS_PORT") 2>/dev/null && break
  sleep 0.1 # polling the server's start, bounded by the loop
done

# Scenarios: an open loop at a rate both servers should hold, one at a rate
# that tells them apart, and the closed-loop maximum.
SCENARIOS=("open-50:--mode open --rate 50" "open-200:--mode open --rate 200" "closed-16:--mode closed --concurrency 16")
for round in $(seq 1 "$ROUNDS"); do
  for sc in "${SCENARIOS[@]}"; do
    name=${sc%%:*}
    read -r -a flags <<<"${sc#*:}"
    for target in hf3fs_meta:$OURS_PORT vllm:$VLLM_PORT; do
      who=${target%%:*}
      log "round $round, $name, $who"
      "$BIN" bench --target "127.0.0.1:${target#*:}" --clear --duration 10 --drain 30 "${flags[@]}" "${SHAPE[@]}" \
        --json --svg "$OUT/$name-$who-$round.svg" >"$OUT/$name-$who-$round.json"
    done
  done
done

python3 - "$OUT" <<'PY'
import json, sys, glob, os, statistics
out = sys.argv[1]
rows = {}
for f in sorted(glob.glob(os.path.join(out, "*.json"))):
    name, who, _ = os.path.basename(f)[:-5].rsplit("-", 2)
    r = json.load(open(f))
    rows.setdefault((name, who), []).append(r)
print("| scenario | server | prompts/s | prompt p50 | prompt p99 | batch_exists p99 | get_locations p99 | batch_allocate p99 | confirm_write p99 | hit rate | not sent |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
ms = lambda v: "-" if v is None else f"{v / 1000:.2f} ms"
for (name, who), rs in sorted(rows.items()):
    med = lambda f: statistics.median([f(r) for r in rs])
    lat = lambda route: med(lambda r: (r["routes"][route]["latency_us"] or {}).get("p99", 0))
    print(f"| {name} | {who} | {med(lambda r: r['prompts']['per_second']):.1f} | "
          f"{ms(med(lambda r: r['prompts']['latency_us']['p50']))} | {ms(med(lambda r: r['prompts']['latency_us']['p99']))} | "
          f"{ms(lat('batch_exists'))} | {ms(lat('get_locations'))} | {ms(lat('batch_allocate'))} | {ms(lat('confirm_write'))} | "
          f"{med(lambda r: r['hit_rate']) * 100:.1f}% | {med(lambda r: r['prompts']['not_sent'])} |")
PY
