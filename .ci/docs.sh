#!/usr/bin/env bash
# The documents' own checks (seconds, no build):
# - perf/RESULTS.md is what perf/scoreboard.tsv renders, each row the newest
#   measurement of its target (perf/scoreboard.sh --check);
# - no document, code comment or script names a numbered issue ("issue 22"):
#   the tracker is not in the repository, so say what the thing is;
# - README.md is at most 300 lines (the details live in docs/);
# - every perf/history/ file is in perf/history/README.md's numbered list.
# (That every relative Markdown link and anchor resolves is a test of the
# Python suite, tests/python/test_doc_links.py, which `cargo test` runs.)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

rc=0
perf/scoreboard.sh --check || rc=1

if git grep -nIE '[Ii]ssues? #?[0-9]' -- '*.md' '*.rs' '*.py' '*.sh' ':!.ci/docs.sh'; then
    echo "docs: the lines above name a numbered issue: say what the thing is instead"
    rc=1
fi
[ "$rc" -eq 0 ] && echo "docs: no numbered issue named"

readme=$(wc -l < README.md)
if [ "$readme" -gt 300 ]; then
    echo "docs: README.md has $readme lines, over 300: move the details to docs/"
    rc=1
else
    echo "docs: README.md has $readme lines (at most 300)"
fi
unlisted=$(for f in perf/history/*.md; do
    b=$(basename "$f")
    [ "$b" = README.md ] || grep -qF "]($b)" perf/history/README.md || echo "  $f"
done)
if [ -n "$unlisted" ]; then
    printf 'docs: perf/history/README.md does not list:\n%s\n' "$unlisted"
    rc=1
fi
exit "$rc"
