#!/usr/bin/env bash
# perf/RESULTS.md is rendered from perf/scoreboard.tsv (one row per target)
# by this script; CI runs it with --check.
#
#   perf/scoreboard.sh           rewrite perf/RESULTS.md from the rows
#   perf/scoreboard.sh --check   fail when perf/RESULTS.md is not what the
#                                rows render, or when a row is not the latest
#
# A row's columns (tab-separated, a header line first): id, section, target,
# latest, verdict, date (YYYY-MM-DD or YYYY-MM-DD HH:MM, UTC), commit,
# command, history (a file of perf/history/). The history file that holds a
# row's measurement names the row's id in a line
# `<!-- scoreboard: ID ID ... -->`. The check fails when a row's history
# file does not name it, when a history file newer than the row's (file
# names begin with their date) names the same target (a newer measurement
# the row does not show), or when the row's date is older than its history
# file's. Each row carries an anchor named by its id (perf/RESULTS.md#ID),
# which other documents link to instead of quoting the figure.
#
# To record a figure: add the run to a history file (a new one per session
# or subject, named by date and subject) with the marker line, update the
# row in perf/scoreboard.tsv, run this script, commit the three.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

mode=render
case "${1:-}" in
    --check) mode=check ;;
    "") ;;
    *) echo "usage: perf/scoreboard.sh [--check]" >&2; exit 2 ;;
esac

exec python3 - "$mode" <<'PY'
import os, re, sys

mode = sys.argv[1]
HEAD = """# Performance results

<!-- Rendered by perf/scoreboard.sh from perf/scoreboard.tsv: edit those, not this file. -->

One row per target: the latest figure measured for it, when, at which
commit, with which command, and the history file that holds the run (raw
figures, conditions, profiles, what was tried and not kept). Every run ever
recorded is in [`history/`](history/README.md). To add a figure: record the
run in a history file, update the target's row in
[`scoreboard.tsv`](scoreboard.tsv), run `perf/scoreboard.sh` (CI checks that
this file is what the rows render, and that each row is the newest
measurement of its target).

## How to read this

- **The machine.** Every figure comes from the project's 2-core VM, loopback
  only, with the load generator on the same two cores, usually shared with
  other builds and tests: absolute throughput and latency move by ±15–30 %
  from one run to the next. Instruction counts (callgrind) do not.
- **Ratios taken side by side.** Over HTTP the server and the bare hyper
  "ceiling" (or an older build, or a reference server) run alternately, round
  by round, in one run; only such ratios are compared across runs.
- **Medians.** A figure is the median of its rounds (in process: criterion's
  estimate); ranges are the spread of rounds or of repeated runs.
- **Verdicts.** ✔ met, ✘ missed (the history file names what stands in the
  way), "measured": no bound was set.
- "128 keys" are one request of vLLM's connector (32-hex keys); "10^6 stored
  keys" means the index holds that many.
- Dates are UTC.
"""
FOOT = """
## The latest run, as a chart

[`results/chart.svg`](results/chart.svg) is made by `perf/chart.sh`: every
scenario of both dialects beside the bare-hyper ceiling and, on the read
routes, beside each engine's own metadata server. Under its title the chart
says how it was made (commit, CPU, cores, load average); its table is
[`results/chart.md`](results/chart.md), its raw results
[`results/chart.jsonl`](results/chart.jsonl).

![hf3fs-meta against the ceiling and the engines' own servers, perf/chart.sh](results/chart.svg)
"""

def anchor(text):
    a = re.sub(r"[^\w\- ]", "", text.lower()).strip().replace(" ", "-")
    return a

rows, errors = [], []
with open("scoreboard.tsv", encoding="utf-8") as f:
    header = f.readline().rstrip("\n").split("\t")
    if header != ["id", "section", "target", "latest", "verdict", "date", "commit", "command", "history"]:
        sys.exit("scoreboard.tsv: unexpected header %r" % header)
    for n, line in enumerate(f, 2):
        if not line.strip():
            continue
        cols = line.rstrip("\n").split("\t")
        if len(cols) != 9:
            errors.append("scoreboard.tsv:%d: %d columns, not 9" % (n, len(cols)))
            continue
        rows.append(dict(zip(header, cols), line=n))

date_re = re.compile(r"^\d{4}-\d{2}-\d{2}( \d{2}:\d{2})?$")
names = {}
for h in sorted(os.listdir("history")):
    if h.endswith(".md"):
        text = open(os.path.join("history", h), encoding="utf-8").read()
        for m in re.finditer(r"<!-- scoreboard: ([^>]*?) -->", text):
            for i in m.group(1).split():
                names.setdefault(i, []).append(h)
seen = set()
for r in rows:
    where = "scoreboard.tsv:%d (%s)" % (r["line"], r["id"])
    if r["id"] in seen:
        errors.append(where + ": a second row for the same target")
    seen.add(r["id"])
    if not date_re.match(r["date"]):
        errors.append(where + ": date %r is not YYYY-MM-DD[ HH:MM]" % r["date"])
    h = r["history"]
    if not os.path.isfile(os.path.join("history", h)):
        errors.append(where + ": no history file perf/history/" + h)
        continue
    files = names.get(r["id"], [])
    if h not in files:
        errors.append(where + ": perf/history/%s does not name it (<!-- scoreboard: %s -->)" % (h, r["id"]))
    newer = [f for f in files if f > h]
    if newer:
        errors.append(where + ": perf/history/%s holds a newer measurement than the row's (%s)" % (newer[-1], h))
    if r["date"][:10] < h[:10]:
        errors.append(where + ": dated %s, older than its history file %s" % (r["date"], h))
for i, files in names.items():
    if i not in seen:
        errors.append("perf/history/%s names %r, which has no row" % (files[0], i))

out = [HEAD]
sections = []
for r in rows:
    if r["section"] not in sections:
        sections.append(r["section"])
out.append("\n## Scoreboard\n\n" + " · ".join(
    "[%s](#%s)" % (s, anchor(s)) for s in sections) + "\n")
for s in sections:
    out.append("\n### %s\n\n| target | latest | | when, commit | command | history |\n|---|---|---|---|---|---|\n" % s)
    for r in rows:
        if r["section"] == s:
            cmd = r["command"].replace("|", "\\|").replace("\\\\|", "\\|")
            out.append("| <a id=\"%s\"></a>%s | %s | %s | %s, %s | `%s` | [%s](history/%s) |\n" % (
                r["id"], r["target"], r["latest"], r["verdict"], r["date"], r["commit"], cmd,
                r["history"][:-3], r["history"]))
out.append(FOOT)
text = "".join(out)

if mode == "render":
    open("RESULTS.md", "w", encoding="utf-8").write(text)
elif open("RESULTS.md", encoding="utf-8").read() != text:
    errors.append("perf/RESULTS.md is not what perf/scoreboard.tsv renders: run perf/scoreboard.sh")
for e in errors:
    print("scoreboard: " + e, file=sys.stderr)
if errors:
    sys.exit(1)
if mode == "check":
    print("scoreboard: %d rows, perf/RESULTS.md up to date" % len(rows))
PY
