#!/usr/bin/env python3
"""No two public types of one name (a second, no build).

Lists every `pub struct|enum|trait|type|union NAME` declared in the tracked
.rs files (restricted visibilities such as `pub(crate)` are not public) and
fails, with the files of each, on a name declared more than once anywhere in
the tree: library crates, binaries, the testkit and the tests alike. A reader
then knows a type by its name, without its module path. A `pub use … as NAME`
re-export counts as a declaration of NAME (it would bring the confusion back).
"""

import re
import subprocess
import sys
from collections import defaultdict

DECL = re.compile(r"^\s*pub\s+(?:struct|enum|trait|type|union)\s+([A-Z][A-Za-z0-9_]*)")
# `pub use path::Old as New;` and `pub use path::{A as New, …};`
RENAMED = re.compile(r"\bas\s+([A-Z][A-Za-z0-9_]*)")
PUB_USE = re.compile(r"^\s*pub\s+use\b")


def declarations(path, text):
    """(name, line number) of each public type declared in one file."""
    out = []
    in_use = False
    for n, line in enumerate(text.splitlines(), 1):
        m = DECL.match(line)
        if m:
            out.append((m.group(1), n))
            continue
        if PUB_USE.match(line):
            in_use = True
        if in_use:
            out.extend((name, n) for name in RENAMED.findall(line))
            if ";" in line:
                in_use = False
    return out


def main():
    files = subprocess.run(
        ["git", "ls-files", "-z", "*.rs"], check=True, capture_output=True
    ).stdout.decode().split("\0")
    seen = defaultdict(list)
    for path in filter(None, files):
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except FileNotFoundError:
            continue
        for name, line in declarations(path, text):
            seen[name].append(f"{path}:{line}")
    dups = {name: at for name, at in seen.items() if len(at) > 1}
    if not dups:
        print(f"pubnames: {len(seen)} public type names, each declared once")
        return 0
    print("pubnames: public type names declared more than once (rename all but one to say what it is):")
    for name in sorted(dups):
        print(f"  {name}: {', '.join(dups[name])}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
