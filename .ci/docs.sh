#!/usr/bin/env bash
# The documents' own checks (seconds, no build):
# - perf/RESULTS.md is what perf/scoreboard.tsv renders, each row the newest
#   measurement of its target (perf/scoreboard.sh --check);
# - every relative link of every tracked Markdown file resolves to a file or
#   folder of the tree (anchors are not checked; http(s) and mailto links
#   are left alone);
# - no document, code comment or script names a numbered issue ("issue 22"):
#   the tracker is not in the repository, so say what the thing is.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

rc=0
perf/scoreboard.sh --check || rc=1

# shellcheck disable=SC2016 # a Python program, not shell
git ls-files -z -- '*.md' | python3 -c '
import os, re, sys
bad = 0
link = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
for path in sys.stdin.read().split("\0"):
    if not path:
        continue
    text = open(path, encoding="utf-8").read()
    # Code spans and fenced blocks hold examples, not links.
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    for n, line in enumerate(text.split("\n"), 1):
        for m in link.finditer(line):
            target = m.group(1)
            if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                continue
            file = target.split("#", 1)[0].split("?", 1)[0]
            full = os.path.normpath(os.path.join(os.path.dirname(path), file))
            if not os.path.exists(full):
                print("links: %s: %s does not resolve (%s)" % (path, target, full))
                bad += 1
sys.exit(1 if bad else 0)
' || rc=1

if git grep -nIE '[Ii]ssues? #?[0-9]' -- '*.md' '*.rs' '*.py' '*.sh' ':!.ci/docs.sh'; then
    echo "docs: the lines above name a numbered issue: say what the thing is instead"
    rc=1
fi
[ "$rc" -eq 0 ] && echo "docs: links resolve, no numbered issue named"
exit "$rc"
