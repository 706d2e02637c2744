#!/usr/bin/env python3
"""The structure figures of the workspace, read from the code (hack/structure-figures.sh).

- the crate graph, from the members' manifests;
- file import circles: the module tree of every crate root (lib.rs, main.rs, src/bin/*.rs)
  is followed through its `mod name;` declarations, and every path a file names
  (`use` trees with their braces, `crate::`, `super::`, `self::`, a child module's name, a
  name a `use` bound to a module) is resolved to the file of the module it reaches; comments,
  strings and `#[cfg(test)]` items are left out. A folder module and the files inside it are
  one room, so a file naming its own ancestors or descendants is no circle; any other set of
  files that reach each other is;
- spawns outside the named-task helper (`tokio::spawn`, `tokio::task::spawn`,
  `std::thread::spawn` in components; tests, benchmarks and the task crate aside);
- kind names (those of the registry's rows) compared or matched in the apiserver outside
  `apiserver/src/registry/` (its strategies and rows): dispatch on a kind belongs to its strategy;
- the largest files.
"""
import os
import re
import sys
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def members():
    with open(os.path.join(ROOT, "Cargo.toml"), "rb") as f:
        return tomllib.load(f)["workspace"]["members"]


def manifest(member):
    with open(os.path.join(ROOT, member, "Cargo.toml"), "rb") as f:
        return tomllib.load(f)


def strip(text):
    """The code without comments, string and char literals (kept as empty strings)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
        elif c == "r" and re.match(r'r#*"', text[i:i + 10]) and (i == 0 or not re.match(r"[A-Za-z0-9_]", text[i - 1])):
            m = re.match(r'r(#*)"', text[i:])
            end = '"' + m.group(1)
            j = text.find(end, i + len(m.group(0)))
            out.append('""')
            i = n if j < 0 else j + len(end)
        elif c == '"' or (c == "b" and text.startswith('b"', i) and (i == 0 or not re.match(r"[A-Za-z0-9_]", text[i - 1]))):
            i += 1 if c == '"' else 2
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
            out.append('""')
            i += 1
        elif c == "'":
            m = re.match(r"'(\\.[^']*|[^\\'])'", text[i:])
            if m:
                out.append("' '")
                i += len(m.group(0))
            else:  # a lifetime
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def drop_test_items(code):
    """The code without `#[cfg(test)]` items (a `mod tests { … }`, a `use …;`, a `fn`)."""
    while True:
        m = re.search(r"#\[cfg\(test\)\]", code)
        if not m:
            return code
        i = m.end()
        semi, brace = code.find(";", i), code.find("{", i)
        if brace < 0 or (0 <= semi < brace):
            code = code[:m.start()] + code[semi + 1:]
            continue
        depth, j = 0, brace
        while j < len(code):
            if code[j] == "{":
                depth += 1
            elif code[j] == "}":
                depth -= 1
                if depth == 0:
                    break
            j += 1
        code = code[:m.start()] + code[j + 1:]


def parse_use_tree(s):
    """`a::{b, c::{self, d}}` → [[a, b], [a, c], [a, c, d]] (each path with its alias)."""
    s = s.strip()
    out = []

    def split_top(x):
        parts, depth, cur = [], 0, ""
        for ch in x:
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            if ch == "," and depth == 0:
                parts.append(cur)
                cur = ""
            else:
                cur += ch
        if cur.strip():
            parts.append(cur)
        return parts

    def walk(prefix, tree):
        tree = tree.strip()
        if not tree:
            return
        if tree.endswith("}") and "{" in tree:
            brace = tree.index("{")
            head = tree[:brace].strip()
            if head.endswith("::"):
                head = head[:-2]
            segs = [x.strip() for x in head.split("::") if x.strip()]
            for part in split_top(tree[brace + 1:-1]):
                walk(prefix + segs, part)
            return
        alias = None
        m = re.match(r"(.*?)\s+as\s+(" + IDENT + r")$", tree, re.S)
        if m:
            tree, alias = m.group(1), m.group(2)
        segs = [x.strip() for x in tree.split("::") if x.strip()]
        if segs and segs[-1] in ("self", "*"):
            segs = segs[:-1]
        out.append((prefix + segs, alias))

    walk([], s)
    return out


class Tree:
    """The module tree of one crate root: module path (tuple) → file."""

    def __init__(self, name, root_file):
        self.name = name
        self.files = {}
        self.add((), root_file, True)

    def add(self, path, file, is_dir_owner):
        self.files[path] = file
        code = strip(open(file).read())
        base = os.path.dirname(file) if is_dir_owner else file[:-3]
        for m in re.finditer(r"(?m)^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(" + IDENT + r")\s*;", code):
            name = m.group(1)
            a, b = os.path.join(base, name + ".rs"), os.path.join(base, name, "mod.rs")
            if os.path.exists(a):
                self.add(path + (name,), a, False)
            elif os.path.exists(b):
                self.add(path + (name,), b, True)


def edges_of(tree):
    mods = set(tree.files)
    edges = {m: set() for m in mods}
    for m, file in tree.files.items():
        code = drop_test_items(strip(open(file).read()))
        children = {p[-1] for p in mods if len(p) == len(m) + 1 and p[:len(m)] == m}
        bound = {}

        def absolute(segs):
            if not segs:
                return None
            head, rest = segs[0], segs[1:]
            if head == "crate":
                return tuple(rest)
            if head == "self":
                return m + tuple(rest)
            if head == "super":
                base = m
                while segs and segs[0] == "super":
                    base = base[:-1]
                    segs = segs[1:]
                return base + tuple(segs)
            if head in children:
                return m + tuple(segs)
            if head in bound:
                return bound[head] + tuple(rest)
            return None

        paths = []
        for u in re.finditer(r"\buse\s+([^;]*);", code):
            for segs, alias in parse_use_tree(u.group(1)):
                p = absolute(segs)
                if p is None:
                    continue
                paths.append(p)
                if p in mods:
                    bound[alias or p[-1]] = p
        rest = re.sub(r"\buse\s+[^;]*;", " ", code)
        for x in re.finditer(r"(?<![A-Za-z0-9_:])((?:" + IDENT + r"::)+" + IDENT + r")", rest):
            p = absolute(x.group(1).split("::"))
            if p is not None:
                paths.append(p)
        for p in paths:
            target = None
            for k in range(len(p), -1, -1):
                if p[:k] in mods:
                    target = p[:k]
                    break
            if target is None or target == m:
                continue
            if target[:len(m)] == m or m[:len(target)] == target:
                continue  # ancestor or descendant: the same room
            edges[m].add(target)
    return edges


def circles(edges):
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(100000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def roots(member):
    src = os.path.join(ROOT, member, "src")
    found = []
    for name in ("lib.rs", "main.rs"):
        if os.path.exists(os.path.join(src, name)):
            found.append((name[:-3], os.path.join(src, name)))
    bindir = os.path.join(src, "bin")
    if os.path.isdir(bindir):
        for f in sorted(os.listdir(bindir)):
            p = os.path.join(bindir, f)
            if f.endswith(".rs"):
                found.append(("bin/" + f[:-3], p))
            elif os.path.exists(os.path.join(p, "main.rs")):
                found.append(("bin/" + f, os.path.join(p, "main.rs")))
    return found


def rel(p):
    return os.path.relpath(p, ROOT)


def main():
    check = "--check" in sys.argv
    problems = []
    ms = members()
    names = {m: manifest(m)["package"]["name"] for m in ms}
    print("== crates and the workspace crates each depends on (from the manifests)")
    by_name = {v: k for k, v in names.items()}
    for m in ms:
        deps = manifest(m).get("dependencies", {})
        ours = sorted(by_name[d] for d in deps if d in by_name)
        print(f"  {m} → {', '.join(ours) if ours else '-'}")
        print(f"      {manifest(m)['package'].get('description', '')}")

    print("== file import circles (every crate root's module tree)")
    count = 0
    for m in ms:
        for root_name, root_file in roots(m):
            tree = Tree(f"{m} ({root_name})", root_file)
            for comp in circles(edges_of(tree)):
                count += 1
                files = ", ".join(rel(tree.files[c]) for c in comp)
                print(f"  {files}")
                problems.append(f"import circle: {files}")
    print(f"  total: {count}")

    print("== spawns outside the named-task helper (components; not tests, benchmarks, the task crate)")
    count = 0
    for m in ms:
        if m in ("conformance", "bench", "task"):
            continue
        for d, _, fs in os.walk(os.path.join(ROOT, m, "src")):
            for f in sorted(fs):
                p = os.path.join(d, f)
                if not f.endswith(".rs") or rel(p) in ("apiserver/storage/src/bench.rs", "apiserver/storage/src/bin/storage-crash-writer.rs"):
                    continue
                code = drop_test_items(strip(open(p).read()))
                n = len(re.findall(r"\btokio::(?:task::)?spawn\s*\(|\bstd::thread::spawn\s*\(", code))
                if n:
                    print(f"  {rel(p)}: {n}")
                    problems.append(f"bare spawn: {rel(p)}")
                count += n
    print(f"  total: {count}")

    print("== kind names compared or matched in the apiserver outside apiserver/src/registry/ (the strategies in kinds/ and the rows)")
    # The kinds are those of the registry's rows; a name counts where code compares or
    # matches a string with it (`== "Pod"`, `"Pod" =>`, `Some("Pod")`, `("", "Pod")`,
    # `| "Pod"`), that is, where it dispatches on a kind. Objects it builds (`"kind": "Pod"`)
    # are data. Code names kinds through the k8s-openapi types' constants (`Pod::KIND`).
    rows = open(os.path.join(ROOT, "apiserver", "src", "registry", "builtin.rs")).read()
    kinds = sorted(set(re.findall(r"row::<[\w:]*?::(\w+)>", rows)))
    name = r'"(?:' + "|".join(kinds) + r')"'
    pattern = re.compile(
        r"(?:[=!]=\s*" + name + r")|(?:" + name + r"\s*(?:=>|\|))|(?:(?:Some|@)\s*\(\s*" + name
        + r")|(?:\(\s*\"[a-z0-9.-]*\",\s*" + name + r"\s*\))|(?:\|\s*" + name + r")"
    )
    count = 0
    for d, _, fs in os.walk(os.path.join(ROOT, "apiserver", "src")):
        for f in sorted(fs):
            p = os.path.join(d, f)
            r = rel(p)
            if not f.endswith(".rs") or r.startswith("apiserver/src/registry/"):
                continue
            text = drop_test_items(open(p).read())
            n = len(pattern.findall(text))
            if n:
                print(f"  {r}: {n}")
                problems.append(f"kind dispatch outside the registry: {r}")
            count += n
    print(f"  total: {count}")

    print("== largest files (lines)")
    sizes = []
    for m in ms:
        for d, _, fs in os.walk(os.path.join(ROOT, m)):
            if "/target" in d:
                continue
            for f in fs:
                if f.endswith(".rs"):
                    p = os.path.join(d, f)
                    sizes.append((sum(1 for _ in open(p)), rel(p)))
    for n, p in sorted(sizes)[-5:]:
        print(f"  {n:6d} {p}")
    total = sum(n for n, _ in sizes)
    print(f"  all {len(sizes)} files: {total} lines")

    if check and problems:
        print("structure check failed:", file=sys.stderr)
        for p in problems:
            print("  " + p, file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
