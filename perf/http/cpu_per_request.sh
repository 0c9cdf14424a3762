#!/usr/bin/env bash
# CPU time per request, server vs bare-hyper ceiling: a figure that the noise
# of a shared machine moves far less than req/s, because it counts the CPU the
# server process itself burned (utime + stime from /proc) over a fixed number
# of requests, not wall time.
#
#   perf/http/cpu_per_request.sh [REQUESTS]      (default 40000 per scenario)
#
# Needs the release binaries (perf/run.sh builds them). Loopback only; every
# run is bounded by its request count. Prints a markdown table.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=perf/lib.sh
source perf/lib.sh
N="${1:-40000}"
BIN=target/release
TICK=$(getconf CLK_TCK)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

SP=$(free_port); CP=$(free_port)
RUST_LOG=warn "$BIN/hf3fs-meta" --host 127.0.0.1 --port "$SP" >/dev/null 2>&1 & pids+=($!); SPID=$!
"$BIN/ceiling" --addr "127.0.0.1:$CP" >/dev/null 2>&1 & pids+=($!); CPID=$!
wait_port "$SP"; wait_port "$CP"

echo "| scenario | server CPU µs/request | ceiling CPU µs/request | server / ceiling |"
echo "|---|---:|---:|---:|"
for sc in exists locations allocate confirm; do
    "$BIN/loadgen" --addr "127.0.0.1:$SP" --scenario "$sc" --setup-only >/dev/null
    measure() { # pid port extra-args...
        local pid=$1 port=$2; shift 2
        local before after
        before=$(cpu_ticks "$pid")
        "$BIN/loadgen" --addr "127.0.0.1:$port" --scenario "$sc" --max-requests "$N" --duration 120 "$@" >/dev/null
        after=$(cpu_ticks "$pid")
        echo $(( (after - before) ))
    }
    s=$(measure "$SPID" "$SP" --no-setup)
    c=$(measure "$CPID" "$CP" --no-setup)
    python3 - "$s" "$c" "$TICK" "$N" "$sc" <<'PY'
import sys
s, c, tick, n, sc = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
su, cu = s / tick / n * 1e6, c / tick / n * 1e6
print(f"| {sc} | {su:.1f} | {cu:.1f} | {su / cu if cu else float('nan'):.2f} |")
PY
done
