# perf/baselines/engine_server.sh — sourced (not run) by perf/baselines/vllm.sh and
# perf/baselines/sglang.sh: the part of bringing up an engine's Python
# metadata server that both share. `pybase_init NAME` makes a scratch venv
# with the servers' stack (fastapi, uvicorn[standard], orjson, requests),
# deleted on exit with whatever it holds, and picks a free loopback port;
# `pybase_start DIR CMD...` starts CMD in DIR in the background (bounded by
# `timeout`, stopped on exit) and waits until it listens on that port.
# Sets TMP, PY, PORT and PID.

# shellcheck source=perf/lib.sh
source perf/lib.sh

pybase_cleanup() {
  if [[ -n "${PID:-}" ]]; then kill -TERM "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true; fi
  rm -rf "$TMP"
}

pybase_init() { # name
  PERF_NAME=$1
  TMP=$(mktemp -d "/tmp/${1%.sh}.XXXXXX")
  PID=""
  trap pybase_cleanup EXIT
  log "scratch venv in $TMP"
  python3 -m venv "$TMP/venv"
  PY="$TMP/venv/bin/python"
  "$PY" -m pip install -q --disable-pip-version-check fastapi 'uvicorn[standard]' orjson requests
  PORT=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
}

pybase_start() { # dir cmd...
  local dir=$1
  shift
  (cd "$dir" && exec timeout 3600 "$@") >"$TMP/server.log" 2>&1 &
  PID=$!
  for _ in $(seq 1 200); do
    (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && return 0
    kill -0 "$PID" 2>/dev/null || { log "the Python server exited:"; tail -n 30 "$TMP/server.log" >&2; exit 1; }
    sleep 0.1 # polling the server's start, bounded by the loop
  done
  log "the Python server did not listen on 127.0.0.1:$PORT within 20 s:"; tail -n 30 "$TMP/server.log" >&2; exit 1
}
