#!/usr/bin/env python3
"""The import circles between the modules (files) of each crate: module A
names B (`crate::`, `super::`, `self::` paths, `use` groups one level deep)
and B names A, directly or round a longer loop. A child naming its own
ancestor is not an edge (that is how a child uses its parent); a path is
attributed to the longest module prefix it names. Exit 1 on any circle.
At 402dbe2 it found the four the house review listed, and nothing else."""
import os, re, subprocess, sys
from collections import defaultdict
root = subprocess.check_output(['git', 'rev-parse', '--show-toplevel']).decode().strip()
os.chdir(root)
files = set(subprocess.check_output(['git', 'ls-files', '*.rs']).decode().split())

def crate_roots():
    roots = []
    for f in files:
        d, b = os.path.split(f)
        if b in ('lib.rs', 'main.rs') and os.path.basename(d) == 'src':
            roots.append(f)
        elif b == 'main.rs' and (re.search(r'(^|/)tests/[^/]+$', d) or re.search(r'src/bin/[^/]+$', d)):
            roots.append(f)
        elif re.search(r'(^|/)(src/bin|benches|examples)$', d) or (re.search(r'(^|/)tests$', d) and b.endswith('.rs')):
            roots.append(f)
    return roots

def modules(rootfile):
    """module path -> file, following `mod x;` (and #[path])."""
    out = {}
    def walk(f, path, dirname):
        if f in out.values():
            return
        out[path] = f
        src = open(f).read()
        pending_path = None
        for m in re.finditer(r'(#\[path\s*=\s*"([^"]+)"\]\s*)?(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;', src):
            name = m.group(3)
            if m.group(2):
                cand = [os.path.normpath(os.path.join(os.path.dirname(f), m.group(2)))]
            else:
                cand = [os.path.join(dirname, name + '.rs'), os.path.join(dirname, name, 'mod.rs')]
            for c in cand:
                if c in files:
                    sub = os.path.join(dirname, name) if not c.endswith('mod.rs') else os.path.dirname(c)
                    if c.endswith(name + '.rs') and not m.group(2):
                        sub = os.path.join(dirname, name)
                    walk(c, path + (name,), sub)
                    break
    base = os.path.basename(rootfile)
    d = os.path.dirname(rootfile)
    walk(rootfile, (), d if base in ('lib.rs', 'main.rs', 'mod.rs') else os.path.join(d, base[:-3]))
    return out

def refs(src, me):
    src = re.sub(r'//[^\n]*', '', src)
    out = set()
    # expand one level of use groups: use a::b::{c, d::e} -> a::b::c, a::b::d::e
    for m in re.finditer(r'\b((?:crate|super|self)(?:::\w+)*)::\{([^{}]*)\}', src):
        for part in m.group(2).split(','):
            part = part.strip().split(' as ')[0].strip()
            if part:
                out.add(m.group(1) + '::' + part)
    for m in re.finditer(r'\b(?:crate|super|self)(?:::\w+)+', src):
        out.add(m.group(0))
    res = set()
    for r in out:
        segs = r.split('::')
        path = list(me)
        i = 0
        if segs[0] == 'crate':
            path = []; i = 1
        while i < len(segs) and segs[i] in ('super', 'self'):
            if segs[i] == 'super' and path:
                path.pop()
            i += 1
        res.add(tuple(path) + tuple(s for s in segs[i:] if s not in ('self', '*')))
    return res

def file_refs(src, me):
    """refs, with those inside an inline `mod x { ... }` resolved from there."""
    out = set()
    spans = []
    for m in re.finditer(r'\bmod\s+(\w+)\s*\{', src):
        depth, i = 0, m.end() - 1
        while i < len(src):
            if src[i] == '{': depth += 1
            elif src[i] == '}':
                depth -= 1
                if depth == 0: break
            i += 1
        spans.append((m.end(), i, m.group(1)))
    outer = src
    for a, b, name in sorted(spans, reverse=True):
        out |= refs(src[a:b], me + (name,))
        outer = outer[:a] + ' ' * (b - a) + outer[b:]
    return out | refs(outer, me)

found = 0
for rf in sorted(crate_roots()):
    mods = modules(rf)
    if len(mods) < 2:
        continue
    g = defaultdict(set)
    for mp, f in mods.items():
        for r in file_refs(open(f).read(), mp):
            # longest module prefix
            best = None
            for k in range(len(r), -1, -1):
                if r[:k] in mods:
                    best = r[:k]; break
            if best is None or best == mp or mp[:len(best)] == best:
                continue  # itself, or an ancestor (a child using its parent)
            g[mp].add(best)
    # Tarjan
    index = {}; low = {}; st = []; on = set(); sccs = []; c = [0]
    sys.setrecursionlimit(10000)
    def sc(v):
        index[v] = low[v] = c[0]; c[0] += 1; st.append(v); on.add(v)
        for w in g[v]:
            if w not in index:
                sc(w); low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = st.pop(); on.discard(w); comp.append(w)
                if w == v: break
            if len(comp) > 1:
                sccs.append(comp)
    for v in list(mods):
        if v not in index:
            sc(v)
    for comp in sccs:
        found += 1
        print(rf, ':', ' <-> '.join(mods[m] for m in comp))
        for m in comp:
            print('   ', mods[m], '->', sorted(mods[w] for w in g[m] if w in comp))
print(f'shape: {found} import circle(s) between modules')
sys.exit(1 if found else 0)
