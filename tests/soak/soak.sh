#!/usr/bin/env bash
# tests/soak/soak.sh — bounded soak and fault-injection run of hf3fs-meta on loopback.
# It starts the release server on a free 127.0.0.1 port with a 4 s reservation
# TTL (expiry happens during the run) and --world-size 8, runs the `soak`
# client against it (connector cycles on 8 ranks + fault injectors, then an
# audit of the invariants over the HTTP API, then a SIGTERM under load), checks
# that the server exits 0 within its shutdown timeout and logs "stopped", and
# kills everything it started on exit (success, failure or Ctrl-C). See
# tests/soak/README.md.
#
# Usage: tests/soak/soak.sh [--duration SECS] [--server-bin PATH] [options] [-- soak options]
#   --duration SECS     total run time of the soak client (default 60: the CI form;
#                       600 is the long form). The load phase gets SECS - 15 s; the
#                       rest is the expiry wait, the audit and the SIGTERM phase.
#   --server-bin PATH   server binary (default: target/<profile>/hf3fs-meta, built here)
#   --soak-bin PATH     soak client (default: target/<profile>/soak, built here)
#   --profile NAME      cargo profile to build and use (default release; CI: ci)
#   --no-build          do not run cargo; use the binaries as they are
#   --workers N         connector-cycle tasks (default 16)
#   --durable           run the server with --data-dir; after the SIGTERM, restart
#                       it on the same directory and re-audit every acknowledged
#                       write against the client's model, then SIGTERM it again
#   --crash             with --durable: SIGKILL the server under load instead of
#                       SIGTERM (a crash), then restart and re-audit the same way
#   --eviction-check    the eviction soak instead (tests/soak/README.md, "Eviction soak"):
#                       ranks of --evict-pages pages, a working set 4x larger, the
#                       server run with --read-lease; writers record each page they
#                       write in a simulated copy, readers check their lease on it.
#                       No fault injectors; not with --durable
#   --kill-every SECS   with --eviction-check: run the server with --data-dir and
#                       SIGKILL it every SECS seconds of the load (at most 20 times,
#                       none in the last 3 s of the load), restarting it at once on
#                       the same directory and port; the clients retry as the
#                       engines do (soak --expect-restarts), and each save's write
#                       takes up to 2 s (--write-delay-ms 2000) so that restarts
#                       fall between allocates and their confirms. Every page located must
#                       hold its key's bytes: zero wrong reads. After the load the
#                       last server is SIGTERMed and must exit 0
#   --read-lease SECS   with --eviction-check: the server's read lease (default 3)
#   --evict-pages N     with --eviction-check: pages per rank (default 4096)
#   --server-arg ARG    one more argument for the server (repeatable), e.g.
#                       --server-arg --evict-high-watermark --server-arg 0.9
#   --json-out FILE     also write the soak summary as JSON
#   --keep-logs DIR     copy the server log to DIR
#   anything after --   passed to the soak client (see `soak --help`)
# Exit status: 0 when every check passed, 1 on any violation or a bad server
# exit, 2 on a usage or setup error.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."
ROOT=$(pwd)
# shellcheck source=perf/lib.sh
source perf/lib.sh

DURATION=60 SERVER_BIN="" SOAK_BIN="" BUILD=1 PROFILE=release WORKERS=16 JSON_OUT="" KEEP_LOGS="" DURABLE=0 CRASH=0
EVICTION=0 READ_LEASE=3 EVICT_PAGES=4096 KILL_EVERY=0 MAX_KILLS=20
TTL=4 SHUTDOWN_TIMEOUT=5
EXTRA=() SERVER_EXTRA=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --duration) DURATION="$2"; shift ;;
    --server-bin) SERVER_BIN="$2"; shift ;;
    --soak-bin) SOAK_BIN="$2"; shift ;;
    --no-build) BUILD=0 ;;
    --profile) PROFILE="$2"; shift ;;
    --workers) WORKERS="$2"; shift ;;
    --durable) DURABLE=1 ;;
    --crash) CRASH=1 ;;
    --eviction-check) EVICTION=1 ;;
    --read-lease) READ_LEASE="$2"; shift ;;
    --kill-every) KILL_EVERY="$2"; shift ;;
    --evict-pages) EVICT_PAGES="$2"; shift ;;
    --server-arg) SERVER_EXTRA+=("$2"); shift ;;
    --json-out) JSON_OUT="$2"; shift ;;
    --keep-logs) KEEP_LOGS="$2"; shift ;;
    --) shift; EXTRA=("$@"); break ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "soak.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
[[ $CRASH == 0 || $DURABLE == 1 ]] || { echo "soak.sh: --crash needs --durable" >&2; exit 2; }
[[ $EVICTION == 0 || $DURABLE == 0 ]] || { echo "soak.sh: --eviction-check keeps no exact model: not with --durable" >&2; exit 2; }
[[ "$KILL_EVERY" =~ ^[0-9]+$ && ( "$KILL_EVERY" == 0 || "$KILL_EVERY" -ge 3 ) ]] \
  || { echo "soak.sh: --kill-every takes whole seconds, at least 3" >&2; exit 2; }
[[ $KILL_EVERY == 0 || $EVICTION == 1 ]] || { echo "soak.sh: --kill-every needs --eviction-check" >&2; exit 2; }
[[ "$READ_LEASE" =~ ^[0-9]+(\.[0-9]+)?$ && "$EVICT_PAGES" =~ ^[0-9]+$ ]] \
  || { echo "soak.sh: --read-lease takes seconds, --evict-pages a whole number" >&2; exit 2; }
[[ "$DURATION" =~ ^[0-9]+$ && "$DURATION" -ge 20 && "$DURATION" -le 3600 ]] \
  || { echo "soak.sh: --duration must be an integer in 20..3600" >&2; exit 2; }

# --- build ---------------------------------------------------------------
if [[ $BUILD == 1 ]]; then
  if [[ -z "$SERVER_BIN" ]]; then
    log "building the server (cargo build --profile $PROFILE --bin hf3fs-meta)"
    perf_build "$PROFILE" --bin hf3fs-meta >&2
  fi
  if [[ -z "$SOAK_BIN" ]]; then
    log "building the soak client (cargo build --profile $PROFILE -p hf3fs-soak --bin soak)"
    perf_build "$PROFILE" -p hf3fs-soak --bin soak >&2
  fi
fi
OUT_DIR=$(perf_bin_dir "$PROFILE")
SERVER_BIN=${SERVER_BIN:-$OUT_DIR/hf3fs-meta}
SOAK_BIN=${SOAK_BIN:-$OUT_DIR/soak}
for b in "$SERVER_BIN" "$SOAK_BIN"; do
  [[ -x "$b" ]] || { log "missing executable $b (run without --no-build?)"; exit 2; }
done

TMP=$(mktemp -d /tmp/hf3fs-soak.XXXXXX)
SERVER_PID="" WATCHDOG_PID="" SOAK_PID=""
cleanup() {
  local rc=$?
  set +e
  [[ -n "$SOAK_PID" ]] && kill -TERM "$SOAK_PID" 2>/dev/null
  if [[ -n "$SERVER_PID" ]] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill -TERM "$SERVER_PID" 2>/dev/null
    for _ in $(seq 1 50); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$SERVER_PID" 2>/dev/null
    wait "$SERVER_PID" 2>/dev/null
  fi
  [[ -n "$WATCHDOG_PID" ]] && { kill -TERM "$WATCHDOG_PID" 2>/dev/null; wait "$WATCHDOG_PID" 2>/dev/null; }
  if [[ -n "$KEEP_LOGS" ]]; then
    mkdir -p "$KEEP_LOGS" && cp "$TMP"/*.log "$KEEP_LOGS"/ 2>/dev/null
  fi
  rm -rf "$TMP"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- start the server ----------------------------------------------------
# Port 0: the server picks a free loopback port and logs it. Info level, so
# the shutdown lines are in the log whatever RUST_LOG says outside.
SERVER_ARGS=(--host 127.0.0.1 --world-size 8 --reservation-ttl "$TTL" --shutdown-timeout "$SHUTDOWN_TIMEOUT")
[[ $DURABLE == 1 || $KILL_EVERY != 0 ]] && SERVER_ARGS+=(--data-dir "$TMP/data")
[[ $EVICTION == 1 ]] && SERVER_ARGS+=(--read-lease "$READ_LEASE")
SERVER_ARGS+=(${SERVER_EXTRA[@]+"${SERVER_EXTRA[@]}"})
LIMIT=$(( DURATION + 180 ))
SERVER_NAME=$(basename "$SERVER_BIN")
start_server() { # logfile [port, default 0: any]; sets SERVER_PID, WATCHDOG_PID, PORT, SERVER_LOG
  SERVER_LOG=$1
  env -u RUST_LOG HF3FS_META_LOG_LEVEL=info "$SERVER_BIN" "${SERVER_ARGS[@]}" --port "${2:-0}" >"$1" 2>&1 &
  SERVER_PID=$!
  # Safety net: the server ends even if this script is SIGKILLed.
  local pid=$SERVER_PID
  (
    sleep "$LIMIT" & s=$!
    trap 'kill "$s" 2>/dev/null; exit 0' TERM
    wait "$s"
    grep -q "$SERVER_NAME" "/proc/$pid/cmdline" 2>/dev/null && kill -KILL "$pid" 2>/dev/null
  ) &
  WATCHDOG_PID=$!
  PORT=""
  for _ in $(seq 1 600); do
    PORT=$(grep -o 'listening addr=127\.0\.0\.1:[0-9]*' "$1" 2>/dev/null | head -n1 | sed 's/.*://') || true
    [[ -n "$PORT" ]] && return 0
    if ! kill -0 "$SERVER_PID" 2>/dev/null; then
      log "the server exited before listening; its log:"; tail -n 30 "$1" >&2; exit 2
    fi
    sleep 0.05
  done
  log "the server did not log its address within 30 s"; tail -n 30 "$1" >&2; exit 2
}

# Waits (bounded) for the server to exit after a SIGTERM and checks it exited
# 0 with the shutdown lines in its log (after a SIGKILL: killed by it). Sets
# FAIL=1 on any problem.
check_exit() { # logfile [KILL]
  local state="" rc
  for _ in $(seq 1 $(( (SHUTDOWN_TIMEOUT + 5) * 10 ))); do
    state=$(sed -n 's/^[0-9]* (.*) \([A-Z]\).*/\1/p' "/proc/$SERVER_PID/stat" 2>/dev/null || true)
    [[ -z "$state" || "$state" == Z ]] && break
    sleep 0.1
  done
  if [[ -n "$state" && "$state" != Z ]]; then
    log "FAIL: the server is still running $(( SHUTDOWN_TIMEOUT + 5 ))s after the SIGTERM"
    FAIL=1
    return
  fi
  set +e; wait "$SERVER_PID"; rc=$?; set -e
  SERVER_PID=""
  kill -TERM "$WATCHDOG_PID" 2>/dev/null; wait "$WATCHDOG_PID" 2>/dev/null || true; WATCHDOG_PID=""
  if [[ "${2:-}" == KILL ]]; then
    if [[ "$rc" != 137 ]]; then log "FAIL: the SIGKILLed server exited with status $rc"; FAIL=1; fi
  else
    if [[ "$rc" != 0 ]]; then log "FAIL: the server exited with status $rc"; FAIL=1; fi
    if ! grep -q 'SIGTERM received' "$1"; then log "FAIL: no 'SIGTERM received' in the server log"; FAIL=1; fi
    if ! grep -q 'hf3fs_meta: stopped$' "$1"; then log "FAIL: no clean 'stopped' line in the server log"; FAIL=1; fi
  fi
  if grep -q 'panicked' "$1"; then log "FAIL: the server log reports a panic"; FAIL=1; fi
  log "server exited with status $rc"
}

# SIGKILLs the server and restarts it on the same data directory and port
# (--kill-every); the restart's log is server-kill-N.log.
crash_restart() { # N
  kill -KILL "$SERVER_PID"
  check_exit "$SERVER_LOG" KILL
  start_server "$TMP/server-kill-$1.log" "$PORT"
  log "SIGKILL $1 under load; restarted on the same --data-dir: pid $SERVER_PID on 127.0.0.1:$PORT"
}

# Every KILL_EVERY seconds of the load (which lasts DURATION - 15 s), while
# the soak client runs: crash_restart. Bounded by MAX_KILLS, and none in the
# last 3 s of the load so that the audit meets a settled server.
soak_running() { # not exited (a zombie not yet waited for has exited)
  local st
  st=$(sed -n 's/^[0-9]* (.*) \([A-Z]\).*/\1/p' "/proc/$SOAK_PID/stat" 2>/dev/null || true)
  [[ -n "$st" && "$st" != Z ]]
}
kill_loop() {
  local load=$(( DURATION - 15 )) t0=$SECONDS next
  KILLS=0
  while (( KILLS < MAX_KILLS )) && soak_running; do
    next=$(( (KILLS + 1) * KILL_EVERY ))
    (( next <= load - 3 )) || break
    while (( SECONDS - t0 < next )) && soak_running; do sleep 0.2; done
    soak_running || break
    KILLS=$(( KILLS + 1 ))
    crash_restart "$KILLS"
    [[ $FAIL == 0 ]] || break
  done
}

start_server "$TMP/server.log"
log "server pid $SERVER_PID on 127.0.0.1:$PORT (ttl ${TTL}s, world 8$([[ $DURABLE == 1 ]] && echo ", --data-dir")$([[ $EVICTION == 1 ]] && echo ", eviction check: read lease ${READ_LEASE}s, $EVICT_PAGES pages")$([[ $KILL_EVERY != 0 ]] && echo ", --data-dir, SIGKILL every ${KILL_EVERY}s")); soak for ${DURATION}s"

# --- the soak ------------------------------------------------------------
SOAK_ARGS=(--addr "127.0.0.1:$PORT" --duration "$DURATION" --workers "$WORKERS" --shutdown-timeout "$SHUTDOWN_TIMEOUT")
# With --kill-every the server changes process: no phase 2 in the client;
# this script SIGTERMs the last server after the soak instead.
if [[ $KILL_EVERY == 0 ]]; then SOAK_ARGS+=(--server-pid "$SERVER_PID"); else SOAK_ARGS+=(--expect-restarts --write-delay-ms 2000); fi
[[ -n "$JSON_OUT" ]] && SOAK_ARGS+=(--json-out "$JSON_OUT")
[[ $DURABLE == 1 ]] && SOAK_ARGS+=(--model-out "$TMP/model.txt")
[[ $CRASH == 1 ]] && SOAK_ARGS+=(--signal KILL)
[[ $EVICTION == 1 ]] && SOAK_ARGS+=(--eviction-check --read-lease "$READ_LEASE" --pages "$EVICT_PAGES")
START=$SECONDS
FAIL=0 KILLS=0
set +e
"$SOAK_BIN" "${SOAK_ARGS[@]}" ${EXTRA[@]+"${EXTRA[@]}"} &
SOAK_PID=$!
[[ $KILL_EVERY != 0 ]] && kill_loop
wait "$SOAK_PID"
SOAK_RC=$?
SOAK_PID=""
set -e

# --- the server's exit -----------------------------------------------------
# The soak client sent SIGTERM in its last phase; the server must be gone
# within its shutdown timeout (plus a little) with status 0. With
# --kill-every the client sent none: the script sends it to the last server.
if [[ $KILL_EVERY != 0 ]]; then
  [[ -n "$SERVER_PID" ]] && kill -TERM "$SERVER_PID"
  if [[ $KILLS == 0 ]]; then log "FAIL: --kill-every $KILL_EVERY: no SIGKILL happened during the load"; FAIL=1; fi
fi
[[ -n "$SERVER_PID" ]] && check_exit "$SERVER_LOG" "$([[ $CRASH == 1 ]] && echo KILL)"
if [[ $SOAK_RC != 0 ]]; then
  log "FAIL: the soak client exited with status $SOAK_RC (see its summary above)"
  FAIL=1
fi
LAST_LOG="$SERVER_LOG"

# --- durable variant: restart on the same data directory, re-audit --------
if [[ $DURABLE == 1 && $FAIL == 0 ]]; then
  start_server "$TMP/server-restart.log"
  LAST_LOG="$TMP/server-restart.log"
  log "restarted on the same --data-dir: pid $SERVER_PID on 127.0.0.1:$PORT; re-auditing"
  set +e
  "$SOAK_BIN" --addr "127.0.0.1:$PORT" --reaudit "$TMP/model.txt" &
  SOAK_PID=$!
  wait "$SOAK_PID"
  RE_RC=$?
  SOAK_PID=""
  set -e
  kill -TERM "$SERVER_PID"
  check_exit "$TMP/server-restart.log"
  if [[ $RE_RC != 0 ]]; then log "FAIL: the re-audit after the restart exited with status $RE_RC"; FAIL=1; fi
fi

if [[ $FAIL != 0 ]]; then
  log "server log (last 20 lines):"; tail -n 20 "$LAST_LOG" >&2
  exit 1
fi
if [[ $KILL_EVERY != 0 ]]; then
  log "PASS in $(( SECONDS - START ))s: eviction soak clean across $KILLS SIGKILL restarts on the same --data-dir (zero wrong reads), last server exited 0 after SIGTERM"
elif [[ $CRASH == 1 ]]; then
  log "PASS in $(( SECONDS - START ))s: soak clean, server SIGKILLed under load, restart on the same --data-dir re-audited clean"
else
  log "PASS in $(( SECONDS - START ))s: $([[ $EVICTION == 1 ]] && echo "eviction soak" || echo soak) clean, server exited 0 after SIGTERM and logged 'stopped'$([[ $DURABLE == 1 ]] && echo "; restart on the same --data-dir re-audited clean")"
fi
