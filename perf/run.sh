#!/usr/bin/env bash
# perf/run.sh — the one command that benchmarks hf3fs-meta. It exists so that
# every number quoted for the server comes from the same procedure: build the
# release server and the harness, start the server and the bare-hyper
# `ceiling` on free loopback ports, and for each scenario run `loadgen`
# against them ALTERNATELY (server, ceiling, server, ceiling, ...) so that the
# noise of a shared machine hits both alike; report medians in one markdown
# table (also written to perf/out/last-run.md, an ignored directory) and draw them as a chart
# (perf/out/last-run.svg: throughput per scenario against the ceiling and the
# baseline, latency percentiles; perf/plot.py with matplotlib from a scratch
# venv, target/perf-plot-venv, made on first use). Everything it starts is
# killed on exit, even on failure or Ctrl-C.
#
# Usage: perf/run.sh [--quick] [--baseline URL] [options]
#   --quick              1 round of 2 s per side (whole run < 1 min once built)
#   --baseline URL       also measure an already-running server (e.g. the Python
#                        reference under uvicorn: --baseline http://127.0.0.1:18000)
#   --rounds N           rounds per side per scenario (default 3; median reported)
#   --duration S         measured seconds per run (default 5)
#   --warmup S           unmeasured seconds before each run (default 1)
#   --connections N      loadgen connections (default 32)
#   --batch N            keys per request (default 128)
#   --threads N          worker threads of server AND ceiling (default: nproc)
#   --loadgen-threads N  loadgen runtime threads (default: nproc, at most 4; on 2
#                        cores 2 saturates the machine, 1 leaves it ~15% idle)
#   --scenarios "A B"    subset of: exists locations allocate confirm cycle, and SGLang's
#                        sglang-exists sglang-indices sglang-reserve sglang-confirm
#                        (perf/baselines/sglang.sh runs those against SGLang's own server)
#   --client raw|hyper   loadgen HTTP client (default raw)
#   --no-build           use the binaries already in target/release
#   --server-is-ceiling  harness self-test: a second ceiling stands in for the server
#   --no-plot            skip the chart (perf/out/last-run.svg)
#   --results FILE       also copy the raw results (one JSON line per run, then one
#                        per target with its peak resident memory, "scenario":"_memory")
# Environment: SERVER_ARGS (extra flags for hf3fs-meta), RUST_LOG / HF3FS_META_LOG_LEVEL
# (default warn, so logging does not skew the numbers).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$(pwd)
# shellcheck source=perf/lib.sh
source perf/lib.sh
REL=$(perf_bin_dir release)

QUICK=0 BASELINE="" ROUNDS=3 DURATION=5 WARMUP=1 CONNS=32 BATCH=128 THREADS=""
SCENARIOS="exists locations allocate confirm cycle" CLIENT=raw BUILD=1 SELFTEST=0 PLOT=1 RESULTS_OUT=""
LG_THREADS=$(( $(nproc) < 4 ? $(nproc) : 4 ))
ROUNDS_SET=0 DURATION_SET=0 WARMUP_SET=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --quick) QUICK=1 ;;
    --baseline) BASELINE="$2"; shift ;;
    --rounds) ROUNDS="$2"; ROUNDS_SET=1; shift ;;
    --duration) DURATION="$2"; DURATION_SET=1; shift ;;
    --warmup) WARMUP="$2"; WARMUP_SET=1; shift ;;
    --connections) CONNS="$2"; shift ;;
    --batch) BATCH="$2"; shift ;;
    --threads) THREADS="$2"; shift ;;
    --loadgen-threads) LG_THREADS="$2"; shift ;;
    --scenarios) SCENARIOS="$2"; shift ;;
    --client) CLIENT="$2"; shift ;;
    --no-build) BUILD=0 ;;
    --server-is-ceiling) SELFTEST=1 ;;
    --no-plot) PLOT=0 ;;
    --results) RESULTS_OUT="$2"; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "run.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
if [[ $QUICK == 1 ]]; then
  [[ $ROUNDS_SET == 1 ]] || ROUNDS=1
  [[ $DURATION_SET == 1 ]] || DURATION=2
  [[ $WARMUP_SET == 1 ]] || WARMUP=0.5
fi

BASE_ADDR=""
if [[ -n "$BASELINE" ]]; then
  BASE_ADDR=${BASELINE#*://}; BASE_ADDR=${BASE_ADDR%%/*}
  BASE_ADDR=${BASE_ADDR/#localhost:/127.0.0.1:}
  case "$BASE_ADDR" in
    127.*:*|\[::1\]:*) ;;
    *) echo "run.sh: --baseline must be a loopback URL like http://127.0.0.1:18000 (got $BASELINE)" >&2; exit 2 ;;
  esac
fi

TMP=$(mktemp -d /tmp/hf3fs-perf.XXXXXX)
PIDS=()
cleanup() {
  local pid
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do
    for _ in $(seq 1 25); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    # The server runs under `timeout`, which leads its own process group.
    kill -KILL -- "-$pid" 2>/dev/null || true
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM


# --- build ---------------------------------------------------------------
if [[ $BUILD == 1 ]]; then
  if [[ $SELFTEST == 0 ]]; then
    log "building the server (cargo build --release)"
    if ! perf_build release >"$TMP/build-server.log" 2>&1; then
      tail -n 30 "$TMP/build-server.log" >&2
      log "server build failed (use --server-is-ceiling to self-test the harness)"; exit 1
    fi
  fi
  log "building the harness (cargo build --release -p hf3fs-perf)"
  if ! perf_build release -p hf3fs-perf >"$TMP/build-perf.log" 2>&1; then
    tail -n 30 "$TMP/build-perf.log" >&2; log "harness build failed"; exit 1
  fi
fi
for b in ceiling loadgen; do
  [[ -x "$REL/$b" ]] || { log "missing $REL/$b (run without --no-build)"; exit 1; }
done
if [[ $SELFTEST == 0 && ! -x "$REL/hf3fs-meta" ]]; then
  log "missing $REL/hf3fs-meta"; exit 1
fi

# --- start targets -------------------------------------------------------
wait_target() { # name pid port logfile
  local i
  for i in $(seq 1 200); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$3") 2>/dev/null; then return 0; fi
    if ! kill -0 "$2" 2>/dev/null; then
      log "$1 exited before listening on port $3; its log:"; tail -n 30 "$4" >&2; exit 1
    fi
    sleep 0.05
  done
  log "$1 did not listen on port $3 within 10 s; its log:"; tail -n 30 "$4" >&2; exit 1
}

# Safety net: ceiling and server end by themselves even if this script is SIGKILLed.
SAFETY=$(awk -v r="$ROUNDS" -v d="$DURATION" -v w="$WARMUP" -v n="$(wc -w <<<"$SCENARIOS")" \
  'BEGIN { printf "%d", 600 + 3 * r * n * (d + w + 15) }')
THREAD_ARGS=()
[[ -n "$THREADS" ]] && THREAD_ARGS=(--threads "$THREADS")

# Below the kernel's ephemeral range: a port that a client socket of the
# load generator (4,096 of them at once) holds cannot be bound.
CEIL_PORT=$(free_port_below_ephemeral)
"$REL/ceiling" --addr "127.0.0.1:$CEIL_PORT" "${THREAD_ARGS[@]}" --exit-after "$SAFETY" >"$TMP/ceiling.log" 2>&1 &
PIDS+=($!); wait_target ceiling "$!" "$CEIL_PORT" "$TMP/ceiling.log"
CEIL_PID=$!

SERVER_PORT=$(free_port_below_ephemeral)
while [[ "$SERVER_PORT" == "$CEIL_PORT" ]]; do SERVER_PORT=$(free_port_below_ephemeral); done
if [[ $SELFTEST == 1 ]]; then
  log "SELF-TEST: a second ceiling stands in for the server"
  "$REL/ceiling" --addr "127.0.0.1:$SERVER_PORT" "${THREAD_ARGS[@]}" --exit-after "$SAFETY" >"$TMP/server.log" 2>&1 &
else
  # `timeout` bounds the server's life even if this script is SIGKILLed
  # (it forwards our TERM to the server on normal cleanup).
  # shellcheck disable=SC2086
  timeout --kill-after=5 "$SAFETY" env HF3FS_META_LOG_LEVEL="${HF3FS_META_LOG_LEVEL:-warn}" RUST_LOG="${RUST_LOG:-warn}" \
    ${THREADS:+HF3FS_META_WORKERS=$THREADS} \
    "$REL/hf3fs-meta" --host 127.0.0.1 --port "$SERVER_PORT" ${SERVER_ARGS:-} >"$TMP/server.log" 2>&1 &
fi
PIDS+=($!); wait_target server "$!" "$SERVER_PORT" "$TMP/server.log"
# The server runs under `timeout`: its own pid is timeout's child.
SERVER_PID=$(pgrep -P "$!" | head -n 1 || true)
SERVER_PID=${SERVER_PID:-$!}
log "server on 127.0.0.1:$SERVER_PORT, ceiling on 127.0.0.1:$CEIL_PORT${BASE_ADDR:+, baseline on $BASE_ADDR}"

# --- run -----------------------------------------------------------------
RESULTS="$TMP/results.jsonl"
: >"$RESULTS"
FAILED=0
jget() { # field jsonline -> value (numbers/bools/null only)
  sed -nE "s/.*\"$1\":(-?[0-9.]+|true|false|null).*/\1/p" <<<"$2"
}
run_one() { # scenario label addr round
  local out rc=0
  out=$(timeout --foreground $(awk -v d="$DURATION" -v w="$WARMUP" 'BEGIN{printf "%d", d + w + 120}') \
    "$REL/loadgen" --addr "$3" --scenario "$1" --label "$2" --json --client "$CLIENT" \
      --duration "$DURATION" --warmup "$WARMUP" --connections "$CONNS" --batch "$BATCH" --threads "$LG_THREADS" \
      2>>"$TMP/loadgen.err") || rc=$?
  if [[ -z "$out" ]]; then
    log "[$1 r$4] $2: loadgen failed (rc=$rc): $(tail -n 3 "$TMP/loadgen.err" | tr '\n' ' ')"
    FAILED=1; return
  fi
  [[ $rc == 0 ]] || { [[ "$2" == ceiling ]] || FAILED=1; }
  echo "$out" >>"$RESULTS"
  log "[$1 r$4] $(printf '%-8s' "$2") $(jget rps "$out") req/s  p50 $(jget p50_us "$out")us  p99 $(jget p99_us "$out")us  http_err $(jget http_errors "$out")  conn_err $(jget conn_errors "$out")  violations $(jget violations "$out")$([[ $rc == 0 ]] || echo "  rc=$rc")"
}
for s in $SCENARIOS; do
  for r in $(seq 1 "$ROUNDS"); do
    run_one "$s" server "127.0.0.1:$SERVER_PORT" "$r"
    run_one "$s" ceiling "127.0.0.1:$CEIL_PORT" "$r"
    if [[ -n "$BASE_ADDR" ]]; then run_one "$s" baseline "$BASE_ADDR" "$r"; fi
  done
done

# Peak resident memory of each target over the whole run (VmHWM).
for t in "server:$SERVER_PID" "ceiling:$CEIL_PID"; do
  hwm=$(sed -nE 's/^VmHWM:[[:space:]]*([0-9]+) kB/\1/p' "/proc/${t#*:}/status" 2>/dev/null || true)
  if [[ -n "$hwm" ]]; then echo "{\"scenario\":\"_memory\",\"label\":\"${t%%:*}\",\"hwm_kb\":$hwm}" >>"$RESULTS"; fi
done
if [[ -n "$RESULTS_OUT" ]]; then cp "$RESULTS" "$RESULTS_OUT"; fi

# --- report --------------------------------------------------------------
median() { # scenario label field
  grep -F "\"scenario\":\"$1\",\"label\":\"$2\"" "$RESULTS" | sed -nE "s/.*\"$3\":(-?[0-9.]+).*/\1/p" | sort -g |
    awk '{ v[NR] = $1 } END { if (NR == 0) print ""; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
total() { # scenario label field
  grep -F "\"scenario\":\"$1\",\"label\":\"$2\"" "$RESULTS" | sed -nE "s/.*\"$3\":(-?[0-9]+).*/\1/p" | awk '{ t += $1 } END { print t + 0 }'
}
fmt_rps() { [[ -z "$1" ]] && { echo "—"; return; }; awk -v x="$1" 'BEGIN { printf "%.0f", x }'; }
fmt_us() { [[ -z "$1" ]] && { echo "—"; return; }; awk -v x="$1" 'BEGIN { if (x >= 10000) printf "%.1f ms", x / 1000; else printf "%d µs", x }'; }
ratio() { [[ -z "$1" || -z "$2" ]] && { echo "—"; return; }; awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "—" }'; }

TABLE="$TMP/table.md"
{
  echo "| scenario | server req/s | ceiling req/s | ratio | p50 | p99 | p99.9 | p99 ratio | baseline req/s |"
  echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
  for s in $SCENARIOS; do
    srps=$(median "$s" server rps); crps=$(median "$s" ceiling rps)
    sp50=$(median "$s" server p50_us); sp99=$(median "$s" server p99_us); sp999=$(median "$s" server p999_us); cp99=$(median "$s" ceiling p99_us)
    brps=""; if [[ -n "$BASE_ADDR" ]]; then brps=$(median "$s" baseline rps); fi
    echo "| $s | $(fmt_rps "$srps") | $(fmt_rps "$crps") | $(ratio "$srps" "$crps") | $(fmt_us "$sp50") | $(fmt_us "$sp99") | $(fmt_us "$sp999") | $(ratio "$sp99" "$cp99") | $(fmt_rps "$brps") |"
  done
} >"$TABLE"
NOTES="$TMP/notes.md"
: >"$NOTES"
for s in $SCENARIOS; do
  for l in server ceiling baseline; do
    n=$(grep -cF "\"scenario\":\"$s\",\"label\":\"$l\"" "$RESULTS" || true)
    [[ $n -gt 0 ]] || continue
    he=$(total "$s" "$l" http_errors); ce=$(total "$s" "$l" conn_errors); vi=$(total "$s" "$l" violations); af=$(total "$s" "$l" alloc_failed)
    if [[ $he != 0 || $ce != 0 || $vi != 0 || $af != 0 ]]; then
      echo "- $s / $l: http errors $he, connection errors $ce, violations $vi, allocate -1 entries $af" >>"$NOTES"
    fi
  done
done

cat "$TABLE"
if [[ -s "$NOTES" ]]; then echo; echo "Problems (summed over rounds):"; cat "$NOTES"; fi

COMMIT=$(git rev-parse --short HEAD 2>/dev/null || echo "no-commit")
DIRTY=$([[ -n "$(git status --porcelain 2>/dev/null)" ]] && echo " (+ uncommitted changes)" || true)
CPU=$(sed -n 's/^model name[[:space:]]*:[[:space:]]*//p' /proc/cpuinfo | head -n 1)
mkdir -p "$ROOT/perf/out"
{
  echo "# hf3fs-meta perf run"
  echo
  echo "- commit: $COMMIT$DIRTY"
  echo "- date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  echo "- nproc: $(nproc); CPU: ${CPU:-unknown}"
  echo "- command: perf/run.sh $([[ $QUICK == 1 ]] && echo --quick) ${BASELINE:+--baseline $BASELINE}"
  echo "- rounds: $ROUNDS per side (alternating), ${DURATION}s measured + ${WARMUP}s warmup each;" \
       "loadgen: -c $CONNS, batch $BATCH, client $CLIENT, $LG_THREADS thread(s); server/ceiling threads: ${THREADS:-default (nproc)}"
  if [[ $SELFTEST == 1 ]]; then echo "- SELF-TEST: the \"server\" column is a second ceiling instance, not hf3fs-meta"; fi
  echo "- req/s, p50, p99, p99.9 are medians over rounds; ratio = server / ceiling (req/s and p99)"
  if [[ $PLOT == 1 ]]; then echo "- chart: [last-run.svg](last-run.svg)"; fi
  echo
  cat "$TABLE"
  if [[ -s "$NOTES" ]]; then echo; echo "Problems (summed over rounds):"; echo; cat "$NOTES"; fi
  echo
  echo "<details><summary>raw loadgen results (one JSON line per run)</summary>"
  echo
  echo '```'
  cat "$RESULTS"
  echo '```'
  echo
  echo "</details>"
} >"$ROOT/perf/out/last-run.md"
log "wrote perf/out/last-run.md"

# --- chart ---------------------------------------------------------------
# matplotlib in a scratch venv of its own (nothing installed system-wide); a
# chart that cannot be drawn is reported but does not fail the run: the
# figures are in the table.
plot() {
  local venv="${HF3FS_PERF_PLOT_VENV:-$ROOT/target/perf-plot-venv}"
  if ! "$venv/bin/python" -c 'import matplotlib' 2>/dev/null; then
    log "making the chart's venv ($venv: perf/plot-requirements.txt)"
    python3 -m venv "$venv" && "$venv/bin/python" -m pip install -q -r "$ROOT/perf/plot-requirements.txt" || return 1
  fi
  "$venv/bin/python" "$ROOT/perf/plot.py" --results "$RESULTS" --out "$ROOT/perf/out/last-run.svg" \
    --title "hf3fs-meta $COMMIT$DIRTY, $(date -u '+%Y-%m-%d'), nproc $(nproc): perf/run.sh $([[ $QUICK == 1 ]] && echo --quick) ${BASELINE:+--baseline $BASELINE}(-c $CONNS, batch $BATCH, medians of $ROUNDS round(s) of ${DURATION}s)"
}
if [[ $PLOT == 1 ]]; then
  if plot; then log "wrote perf/out/last-run.svg"; else log "could not draw perf/out/last-run.svg (see above); the table is complete"; fi
fi
if [[ $FAILED == 1 ]]; then
  log "some runs against the server/baseline failed or found violations (see above)"; exit 1
fi
