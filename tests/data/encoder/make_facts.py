#!/usr/bin/env python3
"""
make_facts.py - writes tests/data/encoder/facts.json: what llama.cpp computes
on the encoder files lamina mkmodel builds (bert-small, nomic-bert-small, at
F16 and Q8_0, seed 1, the WordPiece vocabulary tests/data/vocab/
ggml-vocab-wpm.gguf), for tests/e2e_encoder.py.

For each file: its sha256 (the facts belong to those bytes), and for each
input of INPUTS:
  - ids: llama-tokenize's ids with [CLS] and [SEP] (add special, specials
    not parsed);
  - tokens (F16 files only): llama-embedding's per-token hidden states
    (--pooling none --embd-normalize -1: the last layer's output, not
    normalized), rounded to 6 significant digits;
  - pooled: llama-embedding's pooled vector with the family's pooling
    (bert-small: cls, nomic-bert-small: mean), not normalized.

Run from the repository root after `make build/lamina`, with llama.cpp's
binaries (a CPU build):
  python3 tests/data/encoder/make_facts.py --llama /work/llama.cpp/build/bin
"""
import argparse
import hashlib
import json
import os
import subprocess
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
VOCAB = os.path.join(ROOT, "tests", "data", "vocab", "ggml-vocab-wpm.gguf")
PRESETS = {"bert-small": "cls", "nomic-bert-small": "mean"}
TYPES = ["F16", "Q8_0"]
INPUTS = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "Embeddings: documents, queries & vectors (2024).",
    "deep learning models embed sentences into vectors for search",
    "Caf\u00e9 r\u00e9sum\u00e9 na\u00efve \u00fcber",
    "a",
]


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, check=True, **kw)


def embed(llama, model, text, pooling):
    # llama-embedding prints through its asynchronous logger, whose last lines
    # are now and then lost at exit: run it again until the JSON is whole
    for _ in range(20):
        out = run([os.path.join(llama, "llama-embedding"), "-m", model, "-p", text, "--pooling", pooling,
                   "--embd-normalize", "-1", "--embd-output-format", "json", "-t", "2"]).stdout
        try:
            data = json.loads(out)["data"]
        except ValueError:
            continue
        return [[float("%.6g" % v) for v in d["embedding"]] for d in data]
    raise SystemExit(f"llama-embedding never printed whole JSON for {text!r}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("--llama", default="/work/llama.cpp/build/bin", help="llama.cpp's binaries")
    ap.add_argument("--lamina", default=os.path.join(ROOT, "build", "lamina"))
    ap.add_argument("--out", default=os.path.join(HERE, "facts.json"))
    a = ap.parse_args()
    facts = {"inputs": INPUTS, "files": []}
    with tempfile.TemporaryDirectory() as tmp:
        for preset, pooling in PRESETS.items():
            for t in TYPES:
                path = os.path.join(tmp, f"{preset}-{t}.gguf")
                run([a.lamina, "mkmodel", "--preset", preset, "--type", t, "--vocab-from", VOCAB, "-o", path])
                with open(path, "rb") as f:
                    sha = hashlib.sha256(f.read()).hexdigest()
                cases = []
                for text in INPUTS:
                    r = run([os.path.join(a.llama, "llama-tokenize"), "-m", path, "-p", text, "--ids",
                             "--no-parse-special", "--log-disable"])
                    ids = [int(x) for x in r.stdout.decode().strip().strip("[]").replace(",", " ").split()]
                    tokens = embed(a.llama, path, text, "none")
                    pooled = embed(a.llama, path, text, pooling)[0]
                    if len(tokens) != len(ids):
                        raise SystemExit(f"{preset} {t}: {len(tokens)} token states for {len(ids)} ids")
                    case = {"ids": ids, "pooled": pooled}
                    if t == "F16":
                        case["tokens"] = tokens
                    cases.append(case)
                facts["files"].append({"preset": preset, "type": t, "pooling": pooling, "sha256": sha,
                                       "cases": cases})
                print(f"{preset} {t}: {sha[:16]}..., {len(cases)} inputs")
    with open(a.out, "w") as f:
        json.dump(facts, f, separators=(",", ":"))
        f.write("\n")
    print(f"{a.out}: {os.path.getsize(a.out)} bytes")


if __name__ == "__main__":
    main()
