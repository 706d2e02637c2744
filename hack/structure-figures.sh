#!/usr/bin/env bash
# Prints the structure figures docs/architecture.md quotes: (group, kind) matches outside
# apiserver/src/kinds/ (per file), the largest files, spawns outside a named-task helper,
# and the module import circles of each crate (groups of files that import each other).
set -euo pipefail
cd "$(dirname "$0")/.."
pattern='\("[a-z0-9.-]*", *"[A-Z][A-Za-z]*"\)|kind *== *"[A-Z][A-Za-z]*"'
echo "== (group, kind) matches in apiserver/src outside kinds/ (total, then per file)"
grep -rEc "$pattern" apiserver/src --include=*.rs | grep -v '^apiserver/src/kinds/' | grep -v ':0$' \
  | awk -F: '{ total += $2; print "  " $0 } END { print "  total: " total }'
echo "== largest files (lines)"
find . -name '*.rs' -not -path './target/*' -print0 | xargs -0 wc -l | grep -v ' total$' | sort -n | tail -5
echo "== bare tokio::spawn in components (not in tests, benchmarks or the task crate itself)"
python3 - <<'PY'
import os
count = 0
for d, _, fs in os.walk("."):
    if d.startswith(("./target", "./conformance", "./bench", "./task")) or "/tests" in d:
        continue
    for f in fs:
        p = os.path.join(d, f)
        if not f.endswith(".rs") or p.endswith(("storage/src/bench.rs", "bin/storage-crash-writer.rs")):
            continue
        text = open(p).read().split("#[cfg(test)]")[0]
        n = text.count("tokio::spawn(") + text.count("tokio::task::spawn(")
        if n:
            print(f"  {p}: {n}")
        count += n
print(f"  total: {count}")
PY
echo "== module import circles (files that import each other through crate:: paths)"
python3 - <<'PY'
import os, re, itertools
for crate in ["apiserver", "controllers", "kubelet", "proxy", "serverless-crd", "minik8s"]:
    root = f"{crate}/src"
    files = {}
    for d, _, fs in os.walk(root):
        for f in fs:
            if f.endswith(".rs"):
                p = os.path.join(d, f)
                mod = os.path.relpath(p, root)[:-3].replace("/mod", "").replace("/", "::")
                files[mod] = open(p).read()
    edges = {m: set() for m in files}
    for m, text in files.items():
        for ref in re.findall(r"crate::([a-z_]+(?:::[a-z_]+)*)", text):
            parts = ref.split("::")
            for n in range(len(parts), 0, -1):
                target = "::".join(parts[:n])
                if target in files and target != m and not m.startswith(target + "::") and not target.startswith(m + "::"):
                    edges[m].add(target)
                    break
    # strongly connected components (Tarjan)
    index, low, stack, on, out, i = {}, {}, [], set(), [], [0]
    def visit(v):
        index[v] = low[v] = i[0]; i[0] += 1; stack.append(v); on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w); low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop(); on.discard(w); comp.append(w)
                if w == v: break
            if len(comp) > 1: out.append(sorted(comp))
    import sys; sys.setrecursionlimit(10000)
    for v in files:
        if v not in index: visit(v)
    for comp in out:
        print(f"  {crate}: {len(comp)} files: {', '.join(comp)}")
PY
