"""Every relative link in the repository's Markdown files resolves.

A link `[text](path)` or `[text](path#anchor)` in a `.md` file must name a
file or directory that exists, relative to the file that holds it; an
anchor, into a Markdown file or the same file, must be the slug of one of
that file's headings (GitHub's rule: lower case, punctuation but `-` and
`_` dropped, spaces to `-`, `-1`, `-2`, ... for repeats) or an explicit
`<a id="...">` of it (perf/RESULTS.md's rows carry one each). Links to other
schemes (`https:`, `mailto:`) are not checked. Code blocks and code spans
are skipped, since their brackets are not links.

The files are the ones git tracks, or, outside a git checkout, every `.md`
under the repository but build output and virtual environments.
"""

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SKIP_DIRS = {"target", "node_modules", ".git"}

LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REF_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
FENCE = re.compile(r"^\s{0,3}(```|~~~)")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
HTML_ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")


def markdown_files():
    try:
        out = subprocess.run(
            ["git", "-C", str(REPO), "ls-files", "-z", "--", "*.md"],
            check=True,
            capture_output=True,
        ).stdout.decode()
        files = [REPO / p for p in out.split("\0") if p]
    except (OSError, subprocess.CalledProcessError):
        files = [
            p
            for p in REPO.rglob("*.md")
            if not any(part in SKIP_DIRS or part.startswith(".") for part in p.relative_to(REPO).parts[:-1])
        ]
    return [p for p in files if p.is_file()]


def prose_lines(text):
    """The lines of `text` outside fenced code blocks, with their numbers."""
    fence = None
    for number, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line)
        if m:
            if fence is None:
                fence = m.group(1)
            elif m.group(1) == fence:
                fence = None
            continue
        if fence is None:
            yield number, line


def slug(heading):
    text = CODE_SPAN.sub(lambda m: m.group(2), heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link in a heading keeps its text
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    text = "".join(c for c in text if c.isalnum() or c in "-_ ")
    return text.replace(" ", "-")


_anchors = {}


def anchors(path):
    if path not in _anchors:
        seen, found = {}, set()
        for _, line in prose_lines(path.read_text(encoding="utf-8")):
            found.update(HTML_ANCHOR.findall(CODE_SPAN.sub("", line)))
            m = HEADING.match(line)
            if not m:
                continue
            base = slug(m.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
        _anchors[path] = found
    return _anchors[path]


def links(path):
    for number, line in prose_lines(path.read_text(encoding="utf-8")):
        line = CODE_SPAN.sub("", line)
        for m in LINK.finditer(line):
            yield number, m.group(1)
        m = REF_DEF.match(line)
        if m:
            yield number, m.group(1)


def broken_links(path):
    problems = []
    for number, target in links(path):
        if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith("//"):
            continue  # https:, mailto:, ...
        file_part, _, anchor = target.partition("#")
        where = f"{path.relative_to(REPO)}:{number}: {target}"
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            problems.append(f"{where}: no such file")
            continue
        if anchor and dest.is_file() and dest.suffix == ".md" and anchor.lower() not in anchors(dest):
            problems.append(f"{where}: no heading with that anchor in {dest.relative_to(REPO)}")
    return problems


def test_the_checker_finds_the_markdown_files():
    names = {p.relative_to(REPO).as_posix() for p in markdown_files()}
    assert {"README.md", "perf/RESULTS.md", "docs/api.md"} <= names, sorted(names)


def test_slugs_follow_githubs_rule():
    assert slug("When the durable store cannot write (`--data-dir`)") == "when-the-durable-store-cannot-write---data-dir"
    assert slug("Differences from SGLang's server") == "differences-from-sglangs-server"
    assert slug("Dialect 2: SGLang HiCache") == "dialect-2-sglang-hicache"


def test_explicit_html_anchors_count(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text('# Title\n\n| <a id="row-one"></a>a row | x |\n\n`<a id="in-code"></a>`\n', encoding="utf-8")
    assert anchors(doc) == {"title", "row-one"}


def test_every_relative_link_resolves():
    problems = [p for path in markdown_files() for p in broken_links(path)]
    assert not problems, "broken links in Markdown files:\n" + "\n".join(problems)
