#!/usr/bin/env bash
# perf/http/connections.sh — how the server holds up with many clients:
# perf/run.sh at 32, 256, 1,024 and 4,096 keep-alive connections (the
# server's default cap is 4,096), exists and confirm, server and bare-hyper
# ceiling alternated, the counts alternated round by round, one table per
# count and round, then one summary table
# per scenario: req/s of server and ceiling, their ratio, the server's req/s
# against its own at the first count, its p50, p99 and p99.9, and the peak
# resident memory (VmHWM) of server and ceiling at each count. Loopback only.
#
# Usage: perf/http/connections.sh [--counts "32 256 1024 4096"] [--rounds 2]
#                            [--duration 3] [--no-build]
# Extra options after `--` go to perf/run.sh (e.g. --loadgen-threads 1).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
COUNTS="32 256 1024 4096" ROUNDS=2 DURATION=3 BUILD=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --counts) COUNTS="$2"; shift ;;
    --rounds) ROUNDS="$2"; shift ;;
    --duration) DURATION="$2"; shift ;;
    --no-build) BUILD=(--no-build) ;;
    --) shift; break ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "connections.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
# 4,096 client sockets plus as many server ones, in one process each.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
OUT=$(mktemp -d /tmp/hf3fs-conns.XXXXXX)
trap 'rm -rf "$OUT"' EXIT
# Rounds outside, counts inside: every count is measured once per round, so
# the counts are compared side by side in time as the two targets are
# within a count (the machine's load drifts over minutes).
for r in $(seq 1 "$ROUNDS"); do
  for n in $COUNTS; do
    perf/run.sh "${BUILD[@]}" --no-plot --scenarios "exists confirm" --rounds 1 --duration "$DURATION" \
      --connections "$n" --results "$OUT/res-$n-$r.jsonl" "$@" >"$OUT/run-$n-$r.md" 2>"$OUT/run-$n-$r.log" ||
      { tail -n 20 "$OUT/run-$n-$r.log" >&2; exit 1; }
    BUILD=(--no-build)
    echo "### $n connections, round $r"
    echo
    grep -E '^\|' "$OUT/run-$n-$r.md"
    if grep -q '^Problems' "$OUT/run-$n-$r.md"; then echo; sed -n '/^Problems/,$p' "$OUT/run-$n-$r.md"; fi
    echo
  done
done
for n in $COUNTS; do cat "$OUT"/res-"$n"-*.jsonl >"$OUT/res-$n.jsonl"; done

echo "### Summary (medians of $ROUNDS rounds of ${DURATION}s)"
echo
python3 - "$OUT" $COUNTS <<'PY'
import json, statistics, sys
out, counts = sys.argv[1], sys.argv[2:]
rows = {n: [json.loads(l) for l in open(f"{out}/res-{n}.jsonl") if l.strip()] for n in counts}

def med(n, scenario, label, field):
    v = [r[field] for r in rows[n] if r["scenario"] == scenario and r["label"] == label and field in r]
    return statistics.median(v) if v else None

def ms(us):
    return "—" if us is None else (f"{us / 1000:.1f} ms" if us >= 10_000 else f"{us / 1000:.2f} ms")

def hwm(n, label):
    v = med(n, "_memory", label, "hwm_kb")
    return "—" if v is None else f"{v / 1024:.0f} MB"

for s in ("exists", "confirm"):
    print(f"| {s}: connections | server req/s | ceiling req/s | ratio | server vs {counts[0]} | ceiling vs {counts[0]} "
          "| p50 | p99 | p99.9 | ceiling p99.9 | errors | server peak RSS | ceiling peak RSS |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    s0, c0 = med(counts[0], s, "server", "rps"), med(counts[0], s, "ceiling", "rps")
    for n in counts:
        sr, cr = med(n, s, "server", "rps"), med(n, s, "ceiling", "rps")
        errs = sum(r.get("http_errors", 0) + r.get("conn_errors", 0) + r.get("violations", 0) + r.get("timed_out_conns", 0)
                   for r in rows[n] if r["scenario"] == s and r["label"] == "server")
        print(f"| {int(n):,} | {sr:,.0f} | {cr:,.0f} | {sr / cr:.2f} | {sr / s0:.2f} | {cr / c0:.2f} "
              f"| {ms(med(n, s, 'server', 'p50_us'))} | {ms(med(n, s, 'server', 'p99_us'))} "
              f"| {ms(med(n, s, 'server', 'p999_us'))} | {ms(med(n, s, 'ceiling', 'p999_us'))} | {errs} "
              f"| {hwm(n, 'server')} | {hwm(n, 'ceiling')} |")
    print()
PY
