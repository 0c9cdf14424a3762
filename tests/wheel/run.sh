#!/usr/bin/env bash
# tests/wheel/run.sh — the Python package, end to end: build the wheel with
# maturin (pyproject.toml, `bindings = "bin"`), install it into a fresh venv,
# start `hf3fs-meta` from that venv's PATH on a loopback port, and drive one
# save and load through it.
#
# Usage: tests/wheel/run.sh
# Environment:
#   MATURIN_PY     the Python of a venv with tests/wheel/requirements.txt
#                  (default .venv-tools/bin/python, which .ci/run makes)
#   WHEEL_PROFILE  the cargo profile (default ci: optimized without fat LTO,
#                  what .ci/run uses: the server alone resolves its graph as
#                  the workspace's build does, so maturin finds the tests'
#                  build in target/ci; ci-wheel, unoptimized, is .ci/run's
#                  fallback when they drift apart; `pip install .` uses
#                  release)
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."
ROOT=$PWD
PY=${MATURIN_PY:-$ROOT/.venv-tools/bin/python}
PROFILE=${WHEEL_PROFILE:-ci}

log() { echo "wheel/run.sh: $*" >&2; }
"$PY" -c 'import maturin' 2>/dev/null || {
    log "maturin is not installed for $PY: python3 -m venv .venv-tools && .venv-tools/bin/pip install -r tests/wheel/requirements.txt"
    exit 1
}

TMP=$(mktemp -d /tmp/hf3fs-wheel.XXXXXX)
SERVER_PID=""
cleanup() {
    if [[ -n "$SERVER_PID" ]]; then
        kill -TERM "$SERVER_PID" 2>/dev/null || true
        wait "$SERVER_PID" 2>/dev/null || true
    fi
    rm -rf "$TMP"
}
trap cleanup EXIT

log "maturin build --profile $PROFILE"
SECONDS=0
"$PY" -m maturin build --locked --profile "$PROFILE" --out "$TMP/dist"
log "built in ${SECONDS}s: $(cd "$TMP/dist" && ls)"
shopt -s nullglob
wheels=("$TMP"/dist/hf3fs_meta-*.whl)
[[ ${#wheels[@]} -eq 1 ]] || { log "expected one wheel, found: ${wheels[*]:-none}"; exit 1; }

python3 -m venv "$TMP/venv"
"$TMP/venv/bin/python" -m pip install -q --no-index "${wheels[0]}"
export PATH="$TMP/venv/bin:$PATH"
found=$(command -v hf3fs-meta)
[[ "$found" == "$TMP/venv/bin/hf3fs-meta" ]] || { log "hf3fs-meta on PATH is $found, not the venv's"; exit 1; }
want_version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)
hf3fs-meta --version | grep -q "^hf3fs-meta $want_version " || { log "unexpected --version: $(hf3fs-meta --version)"; exit 1; }

PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
timeout --kill-after=5 120 hf3fs-meta --host 127.0.0.1 --port "$PORT" --workers 1 >"$TMP/server.log" 2>&1 &
SERVER_PID=$!

# One save and one load, as vLLM's connector does them, from the venv's Python.
"$TMP/venv/bin/python" - "http://127.0.0.1:$PORT" "$want_version" <<'PY'
import json, sys, time, urllib.error, urllib.request

base, version = sys.argv[1], sys.argv[2]

def call(method, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, method=method)
    with urllib.request.urlopen(req, timeout=10) as r:
        text = r.read()
        return r.status, (json.loads(text) if text else None)

deadline = time.monotonic() + 20
while True:
    try:
        status, body = call("GET", "/health")
        if status == 200 and body.get("status") == "ok" and body.get("version"):
            break
    except (urllib.error.URLError, ConnectionError):
        pass
    if time.monotonic() > deadline:
        sys.exit("the installed server did not answer /health within 20 s")
    time.sleep(0.05)  # polling the server's start, bounded by the deadline

key = "0123456789abcdef0123456789abcdef"
assert call("POST", "/rank/0/initialize", {"num_pages": 16, "role": "worker"}) == (200, {"message": "Rank 0 initialized with 16 pages"})
status, body = call("POST", "/keys/batch_allocate", {"rank": 0, "keys": [[key, ""]]})
assert status == 200 and body["results"][0][0] == key, body
page = body["results"][0][1]
assert call("POST", "/keys/confirm_write", {"rank": 0, "confirmations": [[key, page]], "pages_to_release": []}) == (204, None)
assert call("POST", "/keys/batch_exists", {"keys": [key]}) == (200, {"exists": [True]})
assert call("POST", "/keys/get_locations", {"rank": 0, "keys": [key]}) == (200, {"locations": [page]})
status, stats = call("GET", "/stats")
assert status == 200 and stats["version"] == version and stats["keys"] == 1, stats
print(f"wheel: the installed hf3fs-meta {version} saved and loaded a block (page {page})")
PY
kill -TERM "$SERVER_PID"
wait "$SERVER_PID" || { log "the server did not exit cleanly on SIGTERM:"; tail -n 20 "$TMP/server.log" >&2; exit 1; }
SERVER_PID=""
log "passed"
