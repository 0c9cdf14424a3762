#!/usr/bin/env bash
# perf/baselines/sglang.sh — SGLang's own Python metadata server as the
# baseline of perf/run.sh's SGLang scenarios, measured on this machine.
#
# Makes a scratch venv at run time (deleted on exit), takes
# sglang/srt/mem_cache/storage/hf3fs/mini_3fs_metadata_server.py out of the
# sglang wheel (pip download --no-deps; the server's code never enters this
# repository), gives it the two names it imports from the engine as stubs
# (PoolName, a str enum with KV = "kv"; Hf3fsMetadataInterface, an empty
# base class), installs fastapi, uvicorn[standard], orjson and requests,
# starts it on a free loopback port and runs
#   perf/run.sh --baseline http://127.0.0.1:PORT --scenarios "<the sglang-* ones>" "$@"
#
# Usage: perf/baselines/sglang.sh [run.sh options, e.g. --quick --no-build]
# Environment: SGLANG_VERSION (default 0.5.23, a cp311 wheel: needs python3.11);
# SGLANG_WHEEL (path of an already downloaded sglang wheel: no download).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
VERSION=${SGLANG_VERSION:-0.5.23}
# shellcheck source=perf/baselines/engine_server.sh
source perf/baselines/engine_server.sh
pybase_init sglang.sh
if [[ -n "${SGLANG_WHEEL:-}" ]]; then
  mkdir -p "$TMP/wheel" && cp "$SGLANG_WHEEL" "$TMP/wheel/"
else
  "$PY" -m pip download -q --disable-pip-version-check --no-deps -d "$TMP/wheel" "sglang==$VERSION"
fi
SRC="$TMP/src"
mkdir -p "$SRC/sglang/srt/mem_cache/storage/hf3fs"
"$PY" - "$TMP/wheel" "$SRC" <<'PY'
import sys, zipfile, pathlib
wheel = next(pathlib.Path(sys.argv[1]).glob("*.whl"))
name = "sglang/srt/mem_cache/storage/hf3fs/mini_3fs_metadata_server.py"
with zipfile.ZipFile(wheel) as z:
    (pathlib.Path(sys.argv[2]) / "mini_3fs_metadata_server.py").write_bytes(z.read(name))
PY
# The two engine names the server imports, as stubs.
for d in sglang sglang/srt sglang/srt/mem_cache sglang/srt/mem_cache/storage sglang/srt/mem_cache/storage/hf3fs; do
  touch "$SRC/$d/__init__.py"
done
printf 'from enum import Enum\n\nclass PoolName(str, Enum):\n    KV = "kv"\n' >"$SRC/sglang/srt/mem_cache/hicache_storage.py"
printf 'class Hf3fsMetadataInterface:\n    pass\n' >"$SRC/sglang/srt/mem_cache/storage/hf3fs/storage_hf3fs.py"

pybase_start "$SRC" env PYTHONPATH="$SRC" "$PY" mini_3fs_metadata_server.py --host 127.0.0.1 --port "$PORT"
log "SGLang $VERSION's metadata server on 127.0.0.1:$PORT"
perf/run.sh --baseline "http://127.0.0.1:$PORT" \
  --scenarios "sglang-exists sglang-indices sglang-reserve sglang-confirm" "$@"
