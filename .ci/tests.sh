#!/usr/bin/env bash
# The workspace's tests (`cargo test --workspace --profile ci`), in two
# queues at once, on the tests' build (this compiles nothing):
#
# - the real-etcd HA binary (tests/ha) alone: one test at a time, each
#   timing leases of 2 s, ~110 s that leave both cores ~93 % idle;
# - every other test target, then the doc tests, at nice 5, so that the HA
#   binary's processes (etcd, the nodes) get a core the moment they wake.
#
# Between them they run exactly what one `cargo test --workspace` runs: the
# second queue names every test target of the workspace but `ha` (read from
# `cargo metadata`, so a new one is never left out) with --lib, --bins and
# --examples, and the same target selection keeps the features of the tests'
# build. Cargo holds target/ci's lock only while it checks the build, not
# while tests run, so the two queues do not wait on each other. The crash-
# state explorer (forgetfs/tests/explore/) is skipped by name: the batch
# lane runs it (.ci/forgetfs.sh). Each queue is bounded (a hang fails the
# step instead of holding CI to its limit); its output is printed whole when
# both are done, the HA binary's first.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

CARGO_TEST=(cargo test --workspace --profile ci --no-fail-fast)
SKIP=(--skip survives_every_crash_state)
others=()
while read -r t; do
    others+=(--test "$t")
done < <(cargo metadata --no-deps --format-version 1 | python3 -c '
import json, sys
for p in json.load(sys.stdin)["packages"]:
    for t in p["targets"]:
        if "test" in t["kind"] and t["name"] != "ha":
            print(t["name"])
')
[ ${#others[@]} -gt 0 ] || { echo "tests: no test target found besides ha"; exit 1; }

logs="$(mktemp -d)"
trap 'rm -rf "$logs"' EXIT
start=$SECONDS
(
    s=$SECONDS
    timeout --signal=TERM 900 "${CARGO_TEST[@]}" --test ha -- "${SKIP[@]}" >"$logs/ha" 2>&1
    rc=$?
    echo "tests: the real-etcd HA binary took $((SECONDS - s))s (exit $rc)" >>"$logs/ha"
    exit $rc
) &
ha_pid=$!
(
    s=$SECONDS
    rc=0
    nice -n 5 timeout --signal=TERM 1200 "${CARGO_TEST[@]}" --lib --bins --examples "${others[@]}" -- "${SKIP[@]}" ||
        rc=$?
    nice -n 5 timeout --signal=TERM 600 "${CARGO_TEST[@]}" --doc || rc=$?
    echo "tests: every other target and the doc tests took $((SECONDS - s))s (exit $rc)"
    exit $rc
) >"$logs/others" 2>&1 &
others_pid=$!
rc=0
wait "$ha_pid" || rc=1
wait "$others_pid" || rc=1
cat "$logs/ha" "$logs/others"
echo "tests: both queues took $((SECONDS - start))s"
exit "$rc"
