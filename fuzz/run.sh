#!/usr/bin/env bash
# Runs every fuzz target (or the ones named) for a bounded time each, starting
# from the committed seeds in fuzz/corpus/<target>/, and exits non-zero as soon
# as one finds a crash (panic, failed oracle, sanitizer report, timeout, OOM).
#
#   fuzz/run.sh [seconds-per-target] [target...]     default: 30 s, all targets
#
# cargo-fuzz needs nightly-only rustc flags (-Zsanitizer=address, sancov);
# RUSTC_BOOTSTRAP=1 lets the stable toolchain accept them. New inputs found go
# to fuzz/run/<target>/ (ignored by git), so later local runs resume from them;
# a crash is saved under fuzz/artifacts/<target>/ and the command to replay it
# is printed (`cargo test --test http fuzz_corpus` replays it too).
#
# CI does not run this: it replays the committed seeds through the same
# oracles (fuzz/oracles/, tests/http/fuzz_corpus.rs) in `cargo test`.
set -euo pipefail

secs="${1:-30}"
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    targets=(decode router ops fast)
fi

cd "$(dirname "${BASH_SOURCE[0]}")/.."
export RUSTC_BOOTSTRAP=1
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "==> installing cargo-fuzz"
    cargo install cargo-fuzz --version 0.13.2 --locked
fi

# FUZZ_SANITIZER=none skips AddressSanitizer (the crate is safe Rust but for
# one audited module, and the build and runs are much faster).
san=(-s "${FUZZ_SANITIZER:-address}")
echo "==> building fuzz targets (release, debug assertions, sanitizer: ${FUZZ_SANITIZER:-address})"
cargo fuzz build -O "${san[@]}"

failed=0
for t in "${targets[@]}"; do
    echo "==> fuzzing $t for ${secs}s"
    mkdir -p "fuzz/run/$t"
    log="fuzz/run/$t.log"
    set +e
    cargo fuzz run -O "${san[@]}" "$t" "fuzz/run/$t" "fuzz/corpus/$t" -- \
        -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 >"$log" 2>&1
    rc=$?
    set -e
    grep -E '^#[0-9]+[[:space:]]+DONE|stat::average_exec_per_sec|stat::number_of_executed_units' "$log" || true
    if [ "$rc" -ne 0 ]; then
        failed=1
        echo "!!! $t failed (exit $rc); last lines of $log:"
        tail -n 60 "$log"
        for a in fuzz/artifacts/"$t"/*; do
            [ -e "$a" ] && echo "replay: RUSTC_BOOTSTRAP=1 cargo fuzz run -O $t $a"
        done
    fi
done
if [ "$failed" -ne 0 ]; then
    echo "fuzz: FAILED"
    exit 1
fi
echo "fuzz: ${#targets[@]} targets ran ${secs}s each without a crash"
