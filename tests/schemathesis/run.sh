#!/usr/bin/env bash
# tests/schemathesis/run.sh — schemathesis against the live server, with the
# OpenAPI document the server serves (docs/openapi.json).
#
# Usage: tests/schemathesis/run.sh [SERVER_BINARY]
#   SERVER_BINARY      default target/ci/hf3fs-meta (built by `cargo test --profile ci`)
# Environment:
#   SCHEMATHESIS_PY    the Python of a venv with tests/schemathesis/requirements.txt
#                      (default .venv-tools/bin/python, which .ci/run makes)
#   ST_MAX_EXAMPLES    generated cases per operation and phase (default 300: about 40 s)
#   ST_SEED            a seed to replay a run (default: random, printed)
#
# What fails the run: any 5xx but the documented 500s (tests/schemathesis/hooks.py),
# a status, content type, header or body the document does not describe, an
# invalid request the server accepts, a 405 without Allow, the server dying
# or panicking, or the whole run outliving its hard limit. The server listens
# on 127.0.0.1 only, with small limits (--max-ranks 64, --max-pages-per-rank
# 65536) so that generated ranks cost little memory.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."
ROOT=$PWD
BIN=${1:-$ROOT/target/ci/hf3fs-meta}
PY=${SCHEMATHESIS_PY:-$ROOT/.venv-tools/bin/python}
MAX_EXAMPLES=${ST_MAX_EXAMPLES:-300}
# A guard against a hung run, not a speed target: a quiet 2-core machine
# finishes in well under two minutes; a loaded one took over 170 s.
HARD_LIMIT_S=300

log() { echo "schemathesis/run.sh: $*" >&2; }
[[ -x "$BIN" ]] || { log "no server binary at $BIN (run cargo test --profile ci first)"; exit 1; }
"$PY" -c 'import schemathesis' 2>/dev/null || {
    log "schemathesis is not importable by $PY: python3 -m venv .venv-tools && .venv-tools/bin/pip install -r tests/schemathesis/requirements.txt"
    exit 1
}
"$PY" tests/schemathesis/hooks.py # the hook's own self-test

TMP=$(mktemp -d /tmp/hf3fs-schemathesis.XXXXXX)
SERVER_PID=""
cleanup() {
    if [[ -n "$SERVER_PID" ]]; then
        kill -TERM "$SERVER_PID" 2>/dev/null || true
        wait "$SERVER_PID" 2>/dev/null || true
    fi
    rm -rf "$TMP"
}
trap cleanup EXIT

PORT=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
BASE="http://127.0.0.1:$PORT"
# `timeout` bounds the server's life even if this script is killed.
timeout --kill-after=5 $((HARD_LIMIT_S + 30)) "$BIN" --host 127.0.0.1 --port "$PORT" --workers 2 \
    --max-ranks 64 --max-pages-per-rank 65536 --log-level warn >"$TMP/server.log" 2>&1 &
SERVER_PID=$!
health() { "$PY" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1] + "/health", timeout=2)' "$BASE" 2>/dev/null; }
for _ in $(seq 1 200); do
    health && break
    kill -0 "$SERVER_PID" 2>/dev/null || { log "the server exited at start:"; cat "$TMP/server.log" >&2; exit 1; }
    sleep 0.05 # polling the server's start, bounded by the loop
done
health || { log "the server did not answer /health within 10 s"; exit 1; }

# Ranks 0..7 exist, so generated requests on small ranks reach the page
# tables, not only the "not initialized" answers.
for r in 0 1 2 3 4 5 6 7; do
    "$PY" -c 'import sys, urllib.request; urllib.request.urlopen(urllib.request.Request(sys.argv[1], data=b"{\"num_pages\": 1024}", method="POST"), timeout=5)' \
        "$BASE/rank/$r/initialize"
done
# SGLang's spaces (r, "kv") too, for its routes.
for r in 0 1 2 3; do
    "$PY" -c 'import sys, urllib.request; urllib.request.urlopen(urllib.request.Request(sys.argv[1], data=b"{\"num_pages\": 1024}", method="POST"), timeout=5)' \
        "$BASE/$r/initialize"
done

SEED_ARGS=()
[[ -n "${ST_SEED:-}" ]] && SEED_ARGS=(--seed "$ST_SEED")
# One worker: with two, hypothesis's threads parsed lambda sources with
# ast.parse at once, and CPython 3.11 raised "SystemError: AST constructor
# recursion depth mismatch" in the tool itself (every case had passed).
WORKERS=${ST_WORKERS:-1}
rc=0
(cd "$TMP" && SCHEMATHESIS_HOOKS=hooks PYTHONPATH="$ROOT/tests/schemathesis" timeout --kill-after=10 "$HARD_LIMIT_S" \
    "$PY" -m schemathesis.cli run "$BASE/openapi.json" --url "$BASE" \
    --checks documented_server_errors,status_code_conformance,content_type_conformance,response_headers_conformance,response_schema_conformance,negative_data_rejection,unsupported_method,allow_header_conformance \
    --max-examples "$MAX_EXAMPLES" --workers "$WORKERS" --request-timeout 10 --no-color "${SEED_ARGS[@]}") || rc=$?

# A crash counts even if every answer before it conformed.
if ! kill -0 "$SERVER_PID" 2>/dev/null; then
    log "the server died during the run:"; tail -n 40 "$TMP/server.log" >&2; exit 1
fi
health || { log "the server no longer answers /health"; exit 1; }
if grep -q 'panicked' "$TMP/server.log"; then
    log "the server panicked:"; grep -A5 'panicked' "$TMP/server.log" >&2; exit 1
fi
if [[ $rc -ne 0 ]]; then
    [[ $rc -eq 124 ]] && log "schemathesis outlived its hard limit of $HARD_LIMIT_S s"
    log "schemathesis failed (exit $rc)"; exit "$rc"
fi
log "passed: no undocumented answer, no server error beyond the documented 500s, no crash"
