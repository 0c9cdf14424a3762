#!/usr/bin/env bash
# The bounded crash-state explorer of the durable layer (forgetfs/tests/
# explore/) on the ci profile; the forgetful file system's own rules and
# the power cuts under load run with the workspace's `cargo test`.
# `--workspace --test explore` (not `-p`) resolves features as the tests'
# build did, so nothing is compiled again.
# Mounting needs root and /dev/fuse (CI has both; elsewhere the tests say
# SKIPPED, or fail under HF3FS_META_REQUIRE_ALL). Bounded to 5 minutes;
# whatever forgetfs mount a killed or failed run left behind is detached at
# the end, pass or fail (a stale FUSE mount blocks whoever touches it).
set -u
cleanup() {
    awk '$1 == "forgetfs" { print $2 }' /proc/mounts | while read -r m; do
        umount -l "$m" 2>/dev/null || fusermount3 -u -z "$m" 2>/dev/null || true
    done
}
trap cleanup EXIT
timeout --signal=TERM 300 cargo test --workspace --profile ci --test explore -- --nocapture 2>&1 |
    grep -v '^test .* \.\.\. ok$'
exit "${PIPESTATUS[0]}"
