#!/usr/bin/env bash
# perf/http/instructions.sh — the server's instructions per request on every data
# route of both dialects, and the bare exchange's (the cost of a key on the read path), counted by
# callgrind: deterministic, so it repeats on a loaded machine where req/s
# does not.
#
# Method: for each route the server runs twice under
# `valgrind --tool=callgrind`, serving 100 and then 600 requests of 128 keys
# over one keep-alive connection (perf/http/instructions.py sends them, the same
# bytes every run, after the same setup: 128 stored keys, and for the
# confirm routes 600 reserved batches, for the release route 600 bound
# ones); the difference of the two totals
# divided by 500 is one request's cost, start-up, setup and shutdown
# cancelled. The bare exchange is perf's ceiling server (a bare hyper server
# that reads the body and answers a fixed reply) sent the batch_exists body.
# Both servers run with one worker thread (WORKERS=n to change it): with
# two, whether a worker parks between requests depends on timing, and the
# counts moved by up to 5% from run to run; with one, by about 1%.
#
# Counts depend on the build profile: the baseline is made with the `ci`
# profile, which is what CI builds (target/ci/hf3fs-meta).
#
# Usage: perf/http/instructions.sh [--check | --write-baseline] [--routes "R ..."]
#          [--profile ci] [--bin PATH] [--ceiling PATH] [--counts "100 600"]
#          [--functions N] [--baseline FILE] [--tolerance PCT] [--stored N]
#   --check           fail (exit 1) when a route costs more than --tolerance
#                     above perf/http/instructions.baseline (rebaseline on purpose,
#                     in the commit that explains the change: --write-baseline)
#   --tolerance PCT   the gate's margin in percent (default 3: one binary's
#                     counts repeat within about 1%, and a rebuild of an
#                     unchanged tree moves a route by up to 2%)
#   --write-baseline  write the counts measured to the baseline file
#   --functions N     also print, per route, the N functions whose own
#                     instructions per request grew most from 100 to 600
#                     requests (where a request's instructions go)
#   --bin/--ceiling   binaries to measure instead of building them
#   --keep DIR        copy the callgrind outputs (ROUTE-COUNT.cg) into DIR
#   --stored N        keys in the index before the measured requests (default
#                     128, the queried ones; more are stored in batches of
#                     8192 first, which under callgrind takes minutes per
#                     10^6; the baseline is made with the default)
#   --server-args "A" more flags for the server (perf/http/kv_events_cost.sh:
#                     --kv-events-*); word-split
# Routes: bare vllm_exists vllm_locations vllm_allocate vllm_confirm
#   vllm_release sglang_exists sglang_locations sglang_allocate sglang_confirm
#   vllm_prefix_keys vllm_prefix, and on demand sglang_prefix
#   (vllm_release: a confirm_write that only frees 128 bound pages;
#   the prefix routes: /keys/longest_prefix of a 128-block chain, as token
#   ids of blocks of 16 hashed by the server, or as its 128 keys)
# Needs valgrind (installed with apt-get when missing and running as root),
# python3 and cargo. Loopback only; every server run is bounded by a timeout.
set -euo pipefail
shopt -s inherit_errexit
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
# shellcheck source=perf/lib.sh
source perf/lib.sh
ROUTES="bare vllm_exists vllm_locations vllm_allocate vllm_confirm vllm_release sglang_exists sglang_locations sglang_allocate sglang_confirm vllm_prefix_keys vllm_prefix"
WORKERS=${WORKERS:-1} PROFILE=ci BIN="" CEILING="" KEEP="" SERVER_ARGS="" COUNTS="100 600" MODE=print FUNCTIONS=0 BASELINE=perf/http/instructions.baseline TOLERANCE=3 STORED=128
while [[ $# -gt 0 ]]; do
  case "$1" in
    --check) MODE=check ;;
    --write-baseline) MODE=write ;;
    --routes) ROUTES="$2"; shift ;;
    --profile) PROFILE="$2"; shift ;;
    --bin) BIN="$2"; shift ;;
    --ceiling) CEILING="$2"; shift ;;
    --counts) COUNTS="$2"; shift ;;
    --functions) FUNCTIONS="$2"; shift ;;
    --baseline) BASELINE="$2"; shift ;;
    --keep) KEEP="$2"; shift ;;
    --tolerance) TOLERANCE="$2"; shift ;;
    --stored) STORED="$2"; shift ;;
    --server-args) SERVER_ARGS="$2"; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "instructions.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
read -r LOW HIGH <<<"$COUNTS"

if ! command -v valgrind >/dev/null || ! command -v callgrind_annotate >/dev/null; then
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends valgrind
  else
    echo "instructions.sh: needs valgrind (apt-get install valgrind)" >&2
    exit 2
  fi
fi
if [ -z "$BIN" ]; then
  perf_build "$PROFILE" -q -p hf3fs-meta --bin hf3fs-meta
  BIN="$(perf_bin_dir "$PROFILE")/hf3fs-meta"
fi
if [ -z "$CEILING" ] && [[ " $ROUTES " == *" bare "* ]]; then
  perf_build "$PROFILE" -q -p hf3fs-perf --bin ceiling
  CEILING="$(perf_bin_dir "$PROFILE")/ceiling"
fi

OUT=$(mktemp -d /tmp/hf3fs-instructions.XXXXXX)
VPID=""
trap '[ -n "$VPID" ] && kill "$VPID" 2>/dev/null; wait 2>/dev/null; [ -z "$KEEP" ] || cp "$OUT"/*.cg "$KEEP"/; rm -rf "$OUT"' EXIT

# One server run under callgrind serving $2 requests of route $1; prints
# the path of its callgrind output.
measure() {
  local route=$1 n=$2 port out
  port=$(free_port)
  out="$OUT/$route-$n.cg"
  if [ "$route" = bare ]; then
    set -- "$CEILING" --addr "127.0.0.1:$port" --threads "$WORKERS"
  else
    # shellcheck disable=SC2086 # word-split on purpose
    set -- "$BIN" --host 127.0.0.1 --port "$port" --workers "$WORKERS" --log-level warn $SERVER_ARGS
  fi
  timeout $((STORED > 128 ? 3600 : 600)) valgrind --tool=callgrind --callgrind-out-file="$out" "$@" >"$OUT/server.log" 2>&1 &
  VPID=$!
  local ready=""
  for _ in $(seq 600); do
    if python3 -c 'import socket,sys; socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=1)' "$port" 2>/dev/null; then
      ready=1
      break
    fi
    sleep 0.1
  done
  [ -n "$ready" ] || { echo "instructions.sh: the server did not start:" >&2; cat "$OUT/server.log" >&2; exit 1; }
  python3 perf/http/instructions.py --port "$port" --route "$route" --requests "$n" --stored "$STORED"
  kill -TERM "$VPID"
  wait "$VPID" || true
  VPID=""
  [ -s "$out" ] || { echo "instructions.sh: no callgrind output for $route:" >&2; cat "$OUT/server.log" >&2; exit 1; }
  echo "$out"
}

: >"$OUT/counts"
for route in $ROUTES; do
  low=$(measure "$route" "$LOW")
  high=$(measure "$route" "$HIGH")
  echo "$route $low $high" >>"$OUT/counts"
done

python3 - "$OUT/counts" "$LOW" "$HIGH" "$MODE" "$BASELINE" "$FUNCTIONS" "$PROFILE" "$TOLERANCE" "$STORED" <<'PY'
import re, subprocess, sys
counts, low, high, mode, baseline_path, functions, profile, tolerance, stored = sys.argv[1:]
tolerance = float(tolerance)
n = int(high) - int(low)

def total(path):
    for line in open(path):
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1])
    raise SystemExit(f"instructions.sh: no total in {path}")

def by_function(path):
    out = subprocess.run(["callgrind_annotate", "--inclusive=no", "--threshold=100", "--auto=no", path],
                         capture_output=True, text=True, check=True).stdout
    rows = {}
    for line in out.splitlines():
        m = re.match(r"^\s*([\d,]+)\s+(?:\(\s*[\d.]+%\)\s+)?(\S.*)$", line)
        if m and "PROGRAM TOTALS" not in line:
            rows[m.group(2)] = rows.get(m.group(2), 0) + int(m.group(1).replace(",", ""))
    return rows

per = {}
for line in open(counts):
    route, lo, hi = line.split()
    per[route] = ((total(hi) - total(lo)) / n, lo, hi)

baseline = {}
try:
    for line in open(baseline_path):
        if line.strip() and not line.startswith("#"):
            route, value = line.split()
            baseline[route] = int(value)
except FileNotFoundError:
    pass

bare = per.get("bare", (None,))[0]
print(f"Instructions per request ({profile} profile; ({high} - {low} requests) / {n}, 128 keys, {int(stored):,} stored):\n")
print("| route | instructions | × bare | baseline | change |")
print("|---|---:|---:|---:|---:|")
failed = []
for route, (value, lo, hi) in per.items():
    ratio = f"{value / bare:.2f}" if bare else ""
    base = baseline.get(route)
    change = f"{(value / base - 1) * 100:+.1f}%" if base else ""
    if base and value > base * (1 + tolerance / 100):
        failed.append(route)
        change += f" (over +{tolerance:g}%)"
    print(f"| {route} | {value:,.0f} | {ratio} | {f'{base:,}' if base else ''} | {change} |")
if int(functions) > 0:
    for route, (value, lo, hi) in per.items():
        a, b = by_function(lo), by_function(hi)
        diff = sorted(((b.get(f, 0) - a.get(f, 0)) / n, f) for f in set(a) | set(b))
        print(f"\n## {route}: {value:,.0f} instructions per request, by function (self)")
        for v, f in reversed(diff[-int(functions):]):
            print(f"  {v:9,.0f}  {f[:160]}")
if mode == "write":
    with open(baseline_path, "w") as f:
        f.write(f"# perf/http/instructions.sh --write-baseline: instructions per request, {profile} profile,\n"
                f"# ({high} - {low} requests) / {n} of 128 keys. CI fails above +{tolerance:g}% (--check).\n")
        for route, (value, _, _) in per.items():
            f.write(f"{route} {round(value)}\n")
    print(f"\nwrote {baseline_path}")
if mode == "check":
    missing = [r for r in per if r not in baseline]
    if missing:
        raise SystemExit(f"instructions.sh: no baseline for {' '.join(missing)} in {baseline_path}")
    if failed:
        raise SystemExit(f"instructions.sh: more than {tolerance:g}% above the baseline: {' '.join(failed)}")
    print(f"\nevery route within {tolerance:g}% of the baseline")
PY
