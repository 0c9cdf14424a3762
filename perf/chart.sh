#!/usr/bin/env bash
# perf/chart.sh — the chart perf/RESULTS.md shows (perf/results/chart.svg) and
# its table (perf/results/chart.md) and raw results (perf/results/chart.jsonl), made
# one way: a full run of every scenario
# of both dialects, hf3fs-meta beside the bare-hyper ceiling AND the engine's
# own metadata server (on the routes it can serve under load), all in one
# chart that says on its face how it was made.
#
# It runs perf/baselines/vllm.sh (vLLM's read scenarios; vLLM's server as the
# baseline), perf/baselines/sglang.sh (SGLang's; SGLang's) and perf/run.sh
# (the write scenarios of both, against the ceiling), each with the given
# options (default: 3 rounds of 5 s, 1 s warmup,
# 32 connections, 128 keys; side by side, round by round, medians), then
# draws all three into one chart with perf/plot.py. The note under the title
# records the commit, the machine (CPU model, cores) and its load average
# before and after, so a chart made on a busy machine says so.
#
# Usage: perf/chart.sh [--no-build] [run.sh options, e.g. --rounds 5]
# Environment: VLLM_WHEEL / SGLANG_WHEEL (already downloaded wheels; by
# default those the Python tests cached in ~/.cache/hf3fs-meta/wheels, when
# present), as the two baseline scripts take them.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=perf/lib.sh
source perf/lib.sh
ROOT=$(pwd)
BUILD=1 ARGS=()
for a in "$@"; do
  if [[ $a == --no-build ]]; then BUILD=0; else ARGS+=("$a"); fi
done
if [[ $BUILD == 1 ]]; then
  perf_build release --bin hf3fs-meta
  perf_build release -p hf3fs-perf --bins
fi
CACHE="$HOME/.cache/hf3fs-meta/wheels"
: "${VLLM_WHEEL:=$(ls "$CACHE"/vllm-*.whl 2>/dev/null | head -n 1 || true)}"
: "${SGLANG_WHEEL:=$(ls "$CACHE"/sglang-*.whl 2>/dev/null | head -n 1 || true)}"
export VLLM_WHEEL SGLANG_WHEEL
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
load() { cut -d' ' -f1-3 /proc/loadavg; }
LOAD_BEFORE=$(load)
STARTED=$(date -u '+%Y-%m-%d %H:%M')
# The engines' servers stall on writes under 32 clients (allocate, confirm,
# SGLang's reserve: 0-1 req/s, history 10 and 22) and keep working through
# their backlog after loadgen gives up, taking the cores from the rounds
# after theirs. So they are measured on the read routes only, and the write
# routes run hf3fs-meta against the ceiling alone. A run.sh that reports
# failed runs still leaves its table; the chart says so.
FAILED=""
perf/baselines/vllm.sh --no-build --no-plot --results "$WORK/vllm.jsonl" \
  --scenarios "exists locations" "${ARGS[@]}" || FAILED+=" vLLM"
cp perf/out/last-run.md "$WORK/vllm.md"
perf/baselines/sglang.sh --no-build --no-plot --results "$WORK/sglang.jsonl" \
  --scenarios "sglang-exists sglang-indices" "${ARGS[@]}" || FAILED+=" SGLang"
cp perf/out/last-run.md "$WORK/sglang.md"
perf/run.sh --no-build --no-plot --results "$WORK/writes.jsonl" \
  --scenarios "allocate confirm sglang-reserve sglang-confirm" "${ARGS[@]}" || FAILED+=" writes"
cp perf/out/last-run.md "$WORK/writes.md"
LOAD_AFTER=$(load)
# The chart's own outputs (perf/results/chart.*) do not make the tree dirty.
COMMIT=$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src core perf ':!perf/results/chart.*' || echo "+dirty")
CPU=$(sed -nE 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
NOTE="$STARTED UTC, $CPU, $(nproc) cores, load average $LOAD_BEFORE before / $LOAD_AFTER after; loadgen on the same cores; medians; baseline = the engine's own server on the read routes (vLLM 0.33.0; SGLang 0.5.23 for sglang-*), which stalls on writes under 32 clients${FAILED:+; runs that failed or erred (see perf/results/chart.md):$FAILED}"
{
  echo "# perf/chart.sh"
  echo
  echo "$NOTE"
  echo
  echo "## vLLM's routes (perf/baselines/vllm.sh)"
  echo
  sed '1d' "$WORK/vllm.md"
  echo
  echo "## SGLang's routes (perf/baselines/sglang.sh)"
  echo
  sed '1d' "$WORK/sglang.md"
  echo
  echo "## The write routes, against the ceiling (perf/run.sh)"
  echo
  sed '1d' "$WORK/writes.md"
} >perf/results/chart.md
# The raw loadgen results (one JSON line per run) beside the table, so the
# chart can be redrawn and checked without a new run.
cat "$WORK/vllm.jsonl" "$WORK/sglang.jsonl" "$WORK/writes.jsonl" >perf/results/chart.jsonl
VENV="${HF3FS_PERF_PLOT_VENV:-$ROOT/target/perf-plot-venv}"
if ! "$VENV/bin/python" -c 'import matplotlib' 2>/dev/null; then
  python3 -m venv "$VENV" && "$VENV/bin/python" -m pip install -q -r perf/plot-requirements.txt
fi
"$VENV/bin/python" perf/plot.py --results perf/results/chart.jsonl \
  --out perf/results/chart.svg --baseline-name "the engine's own server" \
  --title "hf3fs-meta $COMMIT: perf/chart.sh ${ARGS[*]}" --note "$NOTE"
echo "chart.sh: wrote perf/results/chart.svg, perf/results/chart.md and perf/results/chart.jsonl" >&2
