#!/usr/bin/env python3
"""check_docs.py - the documentation's examples, run; its links, followed.

Reads README.md, docs/*.md, bench/README.md and src/**/README.md.

Checked examples. A fenced block opened with ```console on the line after
`<!-- doc-test -->` is run: each line starting with "$ " is a command (a
line ending with a backslash continues on the next), run with bash from the
repository root with a 120-second limit; the lines after it, up to the next
command or the end of the block, are its expected output, stdout and stderr
together. An expected line matches the output line for line, except that
"..." inside a line matches any text and a line that is only "..." matches
any number of lines. A command must exit 0 unless its block is marked
`<!-- doc-test: exit N -->` instead.

Links. Every relative link [text](path) and [text](path#anchor) in those
files must name a file or folder that exists; an anchor must match a heading
of the named markdown file (GitHub's rule: lower case, punctuation dropped,
spaces to hyphens).

BUILD (default build) replaces "build/" at the start of a command path, so
`make asan` could check its own binary; the examples are written for build/.
Prints a PASS or FAIL line per check and the closing line
"N passed, N failed"; exits 1 when anything failed.
"""
import glob
import os
import re
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
MARK = re.compile(r"^<!-- doc-test(?::\s*exit\s+(\d+))?\s*-->\s*$")
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def doc_files():
    files = ["README.md"] + sorted(glob.glob("docs/*.md")) + ["bench/README.md"]
    files += sorted(glob.glob("src/README.md")) + sorted(glob.glob("src/*/README.md"))
    return [f for f in files if os.path.isfile(f)]


def blocks(path):
    """(line number, expected exit status, [(command, [expected lines])]) per checked block."""
    lines = open(path, encoding="utf-8").read().split("\n")
    out = []
    i = 0
    while i < len(lines):
        m = MARK.match(lines[i].strip())
        if not m or i + 1 >= len(lines) or lines[i + 1].strip() != "```console":
            i += 1
            continue
        start, status = i + 2, int(m.group(1) or 0)
        j = start
        cmds = []
        while j < len(lines) and lines[j].strip() != "```":
            line = lines[j]
            if line.startswith("$ "):
                cmd = line[2:]
                while cmd.endswith("\\") and j + 1 < len(lines):
                    j += 1
                    cmd = cmd[:-1] + "\n" + lines[j]
                cmds.append((cmd, []))
            elif cmds:
                cmds[-1][1].append(line)
            j += 1
        out.append((start, status, cmds))
        i = j + 1
    return out


def pattern(expected):
    parts = []
    for line in expected:
        if line.strip() == "...":
            parts.append(r"(?:[^\n]*\n)*?")
        else:
            parts.append(".*".join(re.escape(p) for p in line.rstrip().split("...")) + r"[ \t]*\n")
    return re.compile("".join(parts))


def run_block(path, start, status, cmds, build):
    for cmd, expected in cmds:
        if build != "build":
            cmd = re.sub(r"(^|[\s;&|(])(\./)?build/", lambda m: m.group(1) + build + "/", cmd)
        try:
            p = subprocess.run(["bash", "-c", cmd], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, timeout=120)
        except subprocess.TimeoutExpired:
            return "`%s` ran past 120 s" % cmd
        text = p.stdout.decode("utf-8", "replace")
        if text and not text.endswith("\n"):
            text += "\n"
        if p.returncode != status:
            return "`%s` exited %d (want %d):\n%s" % (cmd, p.returncode, status, text[-1500:])
        while expected and not expected[-1].strip():
            expected = expected[:-1]
        if not pattern(expected).fullmatch(text):
            return "`%s` printed:\n%s\nwhich does not match the shown output:\n%s" % (
                cmd, text[-1500:], "\n".join(expected))
    return None


def anchors(path):
    slugs = set()
    in_code = False
    for line in open(path, encoding="utf-8"):
        if line.startswith("```"):
            in_code = not in_code
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m and not in_code:
            t = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower())
            slugs.add(t.replace(" ", "-"))
    return slugs


def check_links(path):
    bad = []
    text = open(path, encoding="utf-8").read()
    text = re.sub(r"```.*?```", "", text, flags=re.S)  # links inside code are code
    for target in LINK.findall(text):
        if re.match(r"^[a-z]+:", target) or target.startswith("<"):
            continue
        file, _, anchor = target.partition("#")
        dest = os.path.normpath(os.path.join(os.path.dirname(path), file)) if file else path
        if not os.path.exists(dest):
            bad.append("%s: no such file" % target)
        elif anchor and dest.endswith(".md") and anchor.lower() not in anchors(dest):
            bad.append("%s: no heading '%s' in %s" % (target, anchor, dest))
    return bad


def main():
    os.chdir(ROOT)
    build = os.environ.get("BUILD", "build")
    passed = failed = 0
    # the matcher itself: wildcards match, a different line does not
    ok = (pattern(["a ... c", "...", "end"]).fullmatch("a b c\nx\ny\nend\n") is not None and
          pattern(["a"]).fullmatch("b\n") is None and pattern(["a", "b"]).fullmatch("a\n") is None and
          run_block("-", 0, 0, [("echo hi", ["ho"])], "build") is not None and
          run_block("-", 0, 0, [("exit 3", [])], "build") is not None)
    print("%s the matcher tells a shown output from another" % ("PASS" if ok else "FAIL"))
    passed, failed = (1, 0) if ok else (0, 1)
    for path in doc_files():
        for start, status, cmds in blocks(path):
            name = "%s:%d (%s)" % (path, start, cmds[0][0].split("\n")[0][:60] if cmds else "empty")
            why = run_block(path, start, status, cmds, build) if cmds else "a checked block with no command"
            if why:
                failed += 1
                print("FAIL example %s\n  %s" % (name, why.replace("\n", "\n  ")))
            else:
                passed += 1
                print("PASS example %s" % name)
        bad = check_links(path)
        if bad:
            failed += 1
            print("FAIL links of %s\n  %s" % (path, "\n  ".join(bad)))
        else:
            passed += 1
            print("PASS links of %s" % path)
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
