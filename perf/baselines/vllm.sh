#!/usr/bin/env bash
# perf/baselines/vllm.sh — vLLM's own Python metadata server as the baseline of
# perf/run.sh's vLLM scenarios, measured on this machine.
#
# Makes a scratch venv at run time (deleted on exit), takes
# vllm/distributed/kv_transfer/kv_connector/v1/hf3fs/hf3fs_metadata_server.py
# out of the vllm wheel (pip download --no-deps; the server's code never
# enters this repository). The module imports nothing from the engine, only
# fastapi, orjson, requests and (to serve) uvicorn, so it runs beside those
# four as its own `run()` starts it: one uvicorn process with uvloop and
# httptools (uvicorn[standard]), except that uvicorn's access log is off and
# its log level is warning, as hf3fs-meta logs at warn in perf/run.sh
# (VLLM_ACCESS_LOG=1 keeps both, as `python hf3fs_metadata_server.py` does).
# It is started on a free loopback port and measured with
#   perf/run.sh --baseline http://127.0.0.1:PORT --scenarios "exists locations allocate confirm" "$@"
#
# Usage: perf/baselines/vllm.sh [run.sh options, e.g. --quick --no-build]
# Environment: VLLM_VERSION (default 0.33.0, a cp38-abi3 wheel of about
# 340 MB); VLLM_WHEEL (path of an already downloaded vllm wheel: no download);
# VLLM_ACCESS_LOG=1 (uvicorn's access log on, as the module's own main runs it).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
VERSION=${VLLM_VERSION:-0.33.0}
MODULE=vllm/distributed/kv_transfer/kv_connector/v1/hf3fs/hf3fs_metadata_server.py
# shellcheck source=perf/baselines/engine_server.sh
source perf/baselines/engine_server.sh
pybase_init vllm.sh
WHEEL=${VLLM_WHEEL:-}
if [[ -z "$WHEEL" ]]; then
  log "downloading the vllm $VERSION wheel (no dependencies)"
  "$PY" -m pip download -q --disable-pip-version-check --no-deps -d "$TMP/wheel" "vllm==$VERSION"
  WHEEL=$(ls "$TMP"/wheel/vllm-*.whl)
fi
"$PY" - "$WHEEL" "$MODULE" "$TMP/hf3fs_metadata_server.py" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    open(sys.argv[3], "wb").write(z.read(sys.argv[2]))
PY
log "versions: $("$PY" -m pip list --format=freeze 2>/dev/null | grep -Ei '^(fastapi|uvicorn|uvloop|httptools|orjson|starlette)==' | tr '\n' ' ')"

if [[ "${VLLM_ACCESS_LOG:-0}" == 1 ]]; then
  SERVE=(hf3fs_metadata_server.py --host 127.0.0.1 --port "$PORT")
else
  SERVE=(-c "import sys, uvicorn, hf3fs_metadata_server as m
uvicorn.run(m.Hf3fsMetadataServer().app, host='127.0.0.1', port=int(sys.argv[1]), access_log=False, log_level='warning')" "$PORT")
fi
pybase_start "$TMP" "$PY" "${SERVE[@]}"
log "vLLM $(basename "$WHEEL" | cut -d- -f2)'s metadata server on 127.0.0.1:$PORT"
perf/run.sh --baseline "http://127.0.0.1:$PORT" --scenarios "exists locations allocate confirm" "$@"
