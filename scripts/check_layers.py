#!/usr/bin/env python3
"""check_layers.py - the include rules of src/README.md, checked.

Every quoted include in src/ must name its layer folder ("kv/kv.h"), and a
file may include only headers of its own folder or of folders above it in the
layer order below. The public header include/lamina.h includes nothing of
src/; every layer may include it (it names the types shared from the API
down: status codes, finish reasons, request parameters). Header files must
not include each other in a cycle.
Prints each violation and a closing line "N passed, N failed" (one check per
file); exits 1 when anything failed.
"""
import os
import re
import sys

LAYERS = ["base", "format", "kernels", "text", "kv", "dist", "model", "decode", "sched", "serve", "route", "api"]
RANK = {name: i for i, name in enumerate(LAYERS)}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def main():
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    os.chdir(root)
    files = []
    for d in sorted(os.listdir("src")):
        p = os.path.join("src", d)
        if os.path.isdir(p):
            files += [os.path.join(p, f) for f in sorted(os.listdir(p)) if f.endswith((".c", ".h"))]
        elif d.endswith((".c", ".h")):
            files.append(p)
    if os.path.isdir("include"):
        files += [os.path.join("include", f) for f in sorted(os.listdir("include")) if f.endswith(".h")]
    passed = failed = 0
    graph = {}
    for f in files:
        parts = f.split(os.sep)
        problems = []
        with open(f, encoding="utf-8") as fh:
            incs = INCLUDE.findall(fh.read())
        graph[f] = []
        if parts[0] == "include":
            problems += ['includes "%s": the public header includes no internal header' % i
                         for i in incs if i != "lamina.h"]
        elif len(parts) != 3 or parts[1] not in RANK:
            problems.append("is not in a layer folder (%s)" % ", ".join(LAYERS))
        else:
            me = RANK[parts[1]]
            for i in incs:
                if i == "lamina.h":  # the public vocabulary, below every layer
                    graph[f].append(os.path.join("include", i))
                    continue
                layer = i.split("/")[0]
                if "/" not in i or layer not in RANK:
                    problems.append('includes "%s": name the layer folder ("layer/file.h")' % i)
                elif RANK[layer] > me:
                    problems.append('includes "%s": %s/ is below %s/ in the layer order' % (i, layer, parts[1]))
                else:
                    graph[f].append(os.path.join("src", i))
                    if not os.path.exists(os.path.join("src", i)):
                        problems.append('includes "%s", which does not exist' % i)
        for p in problems:
            print("LAYER %s %s" % (f, p))
        if problems:
            failed += 1
        else:
            passed += 1
    # Cycles among headers (a .c file is never included, so only headers matter).
    state = {}
    cycles = []

    def visit(node, stack):
        state[node] = 1
        stack.append(node)
        for nxt in graph.get(node, []):
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node.endswith(".h") and node not in state:
            visit(node, [])
    for c in cycles:
        print("CYCLE " + " -> ".join(c))
    if cycles:
        failed += 1
    else:
        passed += 1
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
