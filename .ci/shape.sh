#!/usr/bin/env bash
# The house's shape, checked without a build (a second):
# - no tracked .rs file over 800 lines;
# - no import circle between the modules of a crate (.ci/circles.py);
# - no two public types of one name in the tree (.ci/pubnames.py).
# (No function over 120 lines is clippy's too_many_lines, denied in
# [workspace.lints.clippy] with its threshold in clippy.toml.)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

rc=0
long=$(git ls-files -z '*.rs' | xargs -0 wc -l | awk '$2 != "total" && $1 > 800 { print "  " $2 ": " $1 " lines" }')
if [ -n "$long" ]; then
    printf 'shape: files over 800 lines (split them by what they hold):\n%s\n' "$long"
    rc=1
else
    echo "shape: no .rs file over 800 lines"
fi
python3 .ci/circles.py || rc=1
python3 .ci/pubnames.py || rc=1
exit "$rc"
