#!/usr/bin/env python3
"""lamina against llama.cpp on the encoder files lamina mkmodel builds
(bert-small, nomic-bert-small; F16 and Q8_0; the WordPiece vocabulary
tests/data/vocab/ggml-vocab-wpm.gguf). The facts and how they were made:
tests/data/encoder/make_facts.py.

For each file:
  - the file written into a temporary folder has the recorded sha256 (the
    facts belong to those bytes);
  - for each recorded input, `lamina logits --hidden`: the ids are
    llama.cpp's ([CLS] ... [SEP]); the family's pooling of lamina's rows
    (bert-small: the [CLS] row; nomic-bert-small: the mean) has a cosine
    similarity >= COS with llama-embedding's pooled vector; on the F16
    files every token's hidden state too has a cosine >= COS with
    llama-embedding's (--pooling none), and a length within NORM_TOL of it
    (relative). (Measured: F16 1.000000 everywhere; Q8_0 pooled >= 0.99994,
    both engines rounding the activations to 8 bits.)
  - the states are not the causal ones: llama.cpp's first token's state
    differs from the state lamina gives the first token run alone (the
    first row sees the later tokens), cosine below 0.999; and the key is
    read: with bert.attention.causal flipped to true in the file's bytes,
    the rows of "[CLS] the" are those of the longer prompt's first two
    (which a causal mask makes blind to what follows), to the printed digit.
One-pass rule: a nomic-bert prompt longer than a pass (the default 512
tokens; no position table limits it) is refused by the model's batch check
(the second pass would start at position 512), naming the rule.
LAMINA_BIN may hold a wrapper command before the binary, as tests/run.sh
sets it.
"""
import hashlib
import json
import math
import os
import shlex
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from testenv import result, summary  # noqa: E402 (tests/ is the script's folder)

HERE = os.path.dirname(os.path.abspath(__file__))
FACTS = os.path.join(HERE, "data", "encoder", "facts.json")
VOCAB = os.path.join(HERE, "data", "vocab", "ggml-vocab-wpm.gguf")
LAMINA = shlex.split(os.environ.get("LAMINA_BIN", "build/lamina"))
COS = 0.9999
NORM_TOL = 0.01


def cos(a, b):
    dot = sum(x * y for x, y in zip(a, b))
    na, nb = math.sqrt(sum(x * x for x in a)), math.sqrt(sum(y * y for y in b))
    return dot / (na * nb) if na and nb else 0.0


def hidden(model, text, ctx=None):
    cmd = LAMINA + ["logits", "-m", model, "-p", text, "--hidden", "-t", "2"] + (["-c", str(ctx)] if ctx else [])
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        return None, None, r.stderr.strip()
    ids, rows = None, []
    for line in r.stdout.splitlines():
        if line.startswith("prompt ids:"):
            ids = [int(x) for x in line.split(":", 1)[1].split()]
        elif line.startswith("hidden "):
            rows.append([float(x) for x in line.split(":", 1)[1].split()])
    return ids, rows, ""


def check_file(tmp, f, inputs):
    name = f"{f['preset']} {f['type']}"
    path = os.path.join(tmp, f"{f['preset']}-{f['type']}.gguf")
    r = subprocess.run(LAMINA + ["mkmodel", "--preset", f["preset"], "--type", f["type"], "--vocab-from", VOCAB,
                                 "-o", path], capture_output=True, text=True)
    if not result(f"{name}: mkmodel", r.returncode == 0, r.stderr):
        return
    with open(path, "rb") as fh:
        sha = hashlib.sha256(fh.read()).hexdigest()
    if not result(f"{name}: the file's sha256", sha == f["sha256"], f"{sha}, facts for {f['sha256']}"):
        return
    for k, (text, case) in enumerate(zip(inputs, f["cases"])):
        ids, rows, err = hidden(path, text)
        if not result(f"{name} input {k}: ids", ids == case["ids"], err or f"lamina {ids}, llama.cpp {case['ids']}"):
            continue
        worst, bad = 1.0, []
        for i, (a, b) in enumerate(zip(rows, case.get("tokens", []))):
            c = cos(a, b)
            na, nb = math.sqrt(sum(x * x for x in a)), math.sqrt(sum(x * x for x in b))
            worst = min(worst, c)
            if c < COS or abs(na - nb) > NORM_TOL * nb:
                bad.append(f"token {i}: cosine {c:.6f}, length {na:.4f} vs {nb:.4f}")
        if "tokens" in case:
            result(f"{name} input {k}: {len(rows)} token states (worst cosine {worst:.6f})",
                   len(rows) == len(case["tokens"]) and not bad, "; ".join(bad[:4]) or f"{len(rows)} rows")
        if f["pooling"] == "cls":
            pooled = rows[0]
        else:
            pooled = [sum(col) / len(rows) for col in zip(*rows)]
        c = cos(pooled, case["pooled"])
        result(f"{name} input {k}: {f['pooling']} pooling (cosine {c:.6f})", c >= COS, f"cosine {c}")
        if k == 1 and f["type"] == "F16":  # the first token alone: what a causal mask would give it
            _, alone, err = hidden(path, text.split()[0])
            c = cos(alone[0], case["tokens"][0]) if alone else 1.0
            result(f"{name}: the first row sees the later tokens (cosine {c:.4f} alone)", c < 0.999, err)
            if f["preset"] == "bert-small":
                check_causal_key(path, text)


def check_causal_key(path, text):
    """bert.attention.causal (a GGUF bool: key, type 7, one byte) set true."""
    with open(path, "rb") as fh:
        data = bytearray(fh.read())
    key = b"bert.attention.causal"
    at = data.find(key) + len(key)
    ok = at >= len(key) and data[at:at + 5] == b"\x07\x00\x00\x00\x00"
    if not result("bert: attention.causal found false in the file", ok, data[at:at + 5].hex()):
        return
    data[at + 4] = 1
    flipped = path + ".causal.gguf"
    with open(flipped, "wb") as fh:
        fh.write(data)
    _, rows, err = hidden(flipped, text)
    _, alone, err2 = hidden(flipped, text.split()[0])
    ok = bool(rows) and bool(alone) and rows[:2] == alone[:2]
    result("bert: with attention.causal true the first rows do not see the later tokens", ok, err or err2)


def main():
    with open(FACTS) as fh:
        facts = json.load(fh)
    with tempfile.TemporaryDirectory() as tmp:
        for f in facts["files"]:
            check_file(tmp, f, facts["inputs"])
        nomic = os.path.join(tmp, "nomic-bert-small-F16.gguf")
        if os.path.exists(nomic):
            _, _, err = hidden(nomic, "word " * 600, ctx=2048)
            result("nomic-bert: a prompt longer than a pass is refused", "non-causal model runs each sequence in one pass"
                   in err, err or "accepted")
    return summary()


if __name__ == "__main__":
    sys.exit(main())
