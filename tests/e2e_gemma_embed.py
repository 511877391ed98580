#!/usr/bin/env python3
"""EmbeddingGemma (gemma-embedding): `lamina embed` against llama.cpp's
llama-embedding on the same bytes.

The facts (tests/data/gemma_embedding/, README.md there; make_facts.sh
regenerates them) are llama-embedding's L2-normalized vectors (--pooling
mean --embd-normalize 2) for the four lines of inputs.txt, one of them (31
tokens) longer than the preset's sliding window of 16:
  - `lamina mkmodel --preset gemma-embedding-small --type F16` (gemma3's
    blocks, non-causal, a symmetric window on 5 layers of 6, mean pooling,
    dense_2 and dense_3 after it), written into a temporary folder, must
    have the recorded sha256, and `lamina info` names its architecture and
    pooling;
  - lamina with the model's own pooling and normalization gives each input
    a vector of the same width (128, dense_3's rows) whose cosine with
    llama.cpp's is >= COS_MIN, of norm 1 within 1e-5, over the same token
    count;
  - the comparison can fail: --pooling last gives vectors whose cosines
    with the mean facts are below COS_MIN;
  - an input longer than the batch (-b 8) is refused with a message saying
    an input of a non-causal model runs in one pass; `lamina run` (a
    generation request) is refused: the model only embeds; `lamina logits`
    is refused too (no LM head), and `--hidden` prints the token rows.
COS_MIN is 0.9999: llama.cpp prints 7 decimals, and the two engines' float
sums differ in order; the measured cosines are above 0.9999999.
"""
import hashlib
import json
import os
import shlex
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from testenv import cos, norm, result, summary  # noqa: E402 (tests/ is the script's folder)

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "data", "gemma_embedding")
INPUTS = os.path.join(DATA, "inputs.txt")
LAMINA = shlex.split(os.environ.get("LAMINA_BIN", "build/lamina"))
COS_MIN = 0.9999


def lamina(*args):
    return subprocess.run([*LAMINA, *args], capture_output=True, timeout=120)


def main():
    with open(os.path.join(DATA, "n_tokens.txt"), encoding="utf-8") as f:
        total = int(f.readline())
    want = [d["embedding"] for d in
            json.load(open(os.path.join(DATA, "gemma-embedding-small-F16.json"), encoding="utf-8"))["data"]]
    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "gemma-embedding-small-F16.gguf")
        p = lamina("mkmodel", "--preset", "gemma-embedding-small", "--type", "F16", "-o", model)
        sha = hashlib.sha256(open(model, "rb").read()).hexdigest() if p.returncode == 0 else p.stderr.decode()
        want_sha = open(os.path.join(DATA, "gemma-embedding-small-F16.sha256"), encoding="utf-8").read().strip()
        result("file_sha256", sha == want_sha, "%s, recorded %s" % (sha, want_sha))
        p = lamina("info", model)
        result("info", p.returncode == 0 and b"architecture:  gemma-embedding" in p.stdout and
               b"pooling:       mean" in p.stdout, p.stdout + p.stderr)

        p = lamina("embed", "-m", model, "-f", INPUTS)
        if result("embed_runs", p.returncode == 0, p.stderr.decode(errors="replace")):
            got = json.loads(p.stdout)
            vecs = [d["embedding"] for d in got["data"]]
            result("shape", len(vecs) == len(want) and all(len(u) == len(v) == 128 for u, v in zip(vecs, want)),
                   [len(u) for u in vecs])
            cs = [cos(u, v) for u, v in zip(vecs, want)]
            result("cosine", len(cs) == len(want) and min(cs) >= COS_MIN, "cosines %s" % cs)
            result("unit_norm", all(abs(norm(u) - 1) < 1e-5 for u in vecs), [norm(u) for u in vecs])
            result("tokens", got["usage"]["prompt_tokens"] == total, "%s, llama.cpp %d" % (got["usage"], total))

        p = lamina("embed", "-m", model, "-f", INPUTS, "--pooling", "last")
        vecs = [d["embedding"] for d in json.loads(p.stdout)["data"]] if p.returncode == 0 else []
        cs = [cos(u, v) for u, v in zip(vecs, want)]
        result("other_pooling_differs", len(cs) == len(want) and max(cs) < COS_MIN, "cosines %s" % cs)

        p = lamina("embed", "-m", model, "-f", INPUTS, "-b", "8")
        result("longer_than_batch_refused", p.returncode == 1 and b"not causal: an input runs in one pass"
               in p.stderr, p.stderr)
        p = lamina("run", "-m", model, "-p", "Hello", "-n", "4")
        result("generation_refused", p.returncode != 0 and b"it only embeds" in p.stderr, p.stdout + p.stderr)
        p = lamina("logits", "-m", model, "-p", "Hello")
        result("logits_refused", p.returncode != 0 and b"no LM head" in p.stderr, p.stdout + p.stderr)
        p = lamina("logits", "-m", model, "-p", "Hello", "--hidden")
        result("hidden_rows", p.returncode == 0 and p.stdout.count(b"hidden ") == 2, p.stdout[:300] + p.stderr)
    return summary()


if __name__ == "__main__":
    sys.exit(main())
