#!/usr/bin/env python3
"""`lamina embed` against llama.cpp's llama-embedding on the same bytes.

The facts (tests/data/embed/, README.md there; make_facts.sh regenerates
them) are llama-embedding's L2-normalized vectors (--embd-normalize 2) for
the three lines of inputs.txt:
  - qwen3-embedding-small, F16: `lamina mkmodel --preset
    qwen3-embedding-small` (Qwen3-Embedding's keys: pooling_type last, EOS
    appended), written into a temporary folder, must have the recorded
    sha256 (and `lamina info` names its pooling); lamina with the model's own pooling and normalization must give
    each input a vector whose cosine with llama.cpp's is >= COS_MIN, of the
    same width, of norm 1 within 1e-5, over the same token count (the EOS
    appended: llama.cpp's count);
  - the bundled chat model with --pooling mean: the same checks against
    llama-embedding --pooling mean; without --pooling it is refused (exit 1,
    the message says it is a generative model);
  - --no-normalize gives vectors that normalized are the default output
    (within 1e-6), not themselves of norm 1; --dimensions 32 -o text gives
    32 floats per line, the first 32 of the raw vector normalized;
  - --out FILE writes the JSON standard output shows; --out onto the input
    file is refused and the input left as it was;
  - encoders (non-causal attention), on the files and llama.cpp's pooled
    vectors of tests/e2e_encoder.py (tests/data/encoder/facts.json):
    bert-small (cls) and nomic-bert-small (mean), F16 and Q8_0, all six
    inputs at once with the model's pooling: cosine >= COS_MIN per input and
    llama.cpp's token count; with a batch of 24 tokens (each input must run
    whole, so inputs wait for a pass with room) the same vectors to the
    printed digit; an input longer than the batch is refused (exit 1, the
    message says why).
COS_MIN is 0.9999: llama.cpp prints 7 decimals (an error of 5e-8 on values
of about 0.06), and the two engines' float sums differ in order; the
measured cosines are above 0.999999.
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
DATA = os.path.join(HERE, "data", "embed")
INPUTS = os.path.join(DATA, "inputs.txt")
LAMINA = shlex.split(os.environ.get("LAMINA_BIN", "build/lamina"))
COS_MIN = 0.9999


def lamina(*args):
    return subprocess.run([*LAMINA, *args], capture_output=True, timeout=120)


def tokens_recorded():
    out = {}
    with open(os.path.join(DATA, "n_tokens.txt"), encoding="utf-8") as f:
        for line in f:
            k, v = line.split()
            out[k] = int(v)
    return out


def compare(name, model, facts, n_tokens, *flags):
    """lamina's JSON for the inputs against llama.cpp's: returns lamina's vectors or None."""
    p = lamina("embed", "-m", model, "-f", INPUTS, *flags)
    if not result(name + "_runs", p.returncode == 0, p.stderr.decode(errors="replace")):
        return None
    got = json.loads(p.stdout)
    want = [d["embedding"] for d in json.load(open(os.path.join(DATA, facts), encoding="utf-8"))["data"]]
    vecs = [d["embedding"] for d in got["data"]]
    result(name + "_shape", got["object"] == "list" and len(vecs) == len(want) and
           all(d["object"] == "embedding" and d["index"] == i for i, d in enumerate(got["data"])) and
           all(len(u) == len(v) for u, v in zip(vecs, want)), [len(u) for u in vecs])
    cs = [cos(u, v) for u, v in zip(vecs, want)]
    result(name + "_cosine", len(cs) == len(want) and min(cs) >= COS_MIN, "cosines %s" % cs)
    result(name + "_unit_norm", all(abs(norm(u) - 1) < 1e-5 for u in vecs), [norm(u) for u in vecs])
    result(name + "_tokens", got["usage"]["prompt_tokens"] == n_tokens, "%s, llama.cpp %d" % (got["usage"], n_tokens))
    return vecs


def encoders(tmp):
    facts = json.load(open(os.path.join(HERE, "data", "encoder", "facts.json"), encoding="utf-8"))
    inputs = os.path.join(tmp, "enc_inputs.txt")
    with open(inputs, "w", encoding="utf-8") as f:
        f.write("\n".join(facts["inputs"]) + "\n")
    for x in facts["files"]:
        name = "%s_%s" % (x["preset"], x["type"])
        path = os.path.join(tmp, name + ".gguf")
        lamina("mkmodel", "--preset", x["preset"], "--type", x["type"], "--vocab-from",
               os.path.join(HERE, "data", "vocab", "ggml-vocab-wpm.gguf"), "-o", path)
        p = lamina("embed", "-m", path, "-f", inputs)
        if not result(name + "_runs", p.returncode == 0, p.stderr):
            continue
        got = json.loads(p.stdout)
        cs = [cos(d["embedding"], c["pooled"]) for d, c in zip(got["data"], x["cases"])]
        result(name + "_cosine", len(cs) == len(x["cases"]) and min(cs) >= COS_MIN, "cosines %s" % cs)
        n = sum(len(c["ids"]) for c in x["cases"])
        result(name + "_tokens", got["usage"]["prompt_tokens"] == n, "%s, llama.cpp %d" % (got["usage"], n))
        if x["type"] != "F16":
            continue
        q = lamina("embed", "-m", path, "-f", inputs, "-b", "24")
        result(name + "_small_batch_same", q.returncode == 0 and q.stdout == p.stdout, q.stderr)
        q = lamina("embed", "-m", path, "-p", " ".join(["word"] * 40), "-b", "24")
        result(name + "_longer_than_batch_refused", q.returncode == 1 and b"one pass" in q.stderr, q.stderr)


def main():
    ntok = tokens_recorded()
    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "qwen3-embedding-small-F16.gguf")
        p = lamina("mkmodel", "--preset", "qwen3-embedding-small", "--type", "F16", "--vocab-from",
                   os.path.join(HERE, "data", "vocab", "ggml-vocab-gpt-2.gguf"), "-o", model)
        sha = hashlib.sha256(open(model, "rb").read()).hexdigest() if p.returncode == 0 else p.stderr.decode()
        want_sha = open(os.path.join(DATA, "qwen3-embedding-small-F16.sha256"), encoding="utf-8").read().strip()
        result("qwen3_embedding_file_sha256", sha == want_sha, "%s, recorded %s" % (sha, want_sha))
        p = lamina("info", model)
        result("info_shows_pooling", p.returncode == 0 and
               b"pooling:       last (EOS appended to each input)" in p.stdout, p.stdout + p.stderr)
        vecs = compare("qwen3_embedding_last", model, "qwen3-embedding-small-F16.json",
                       ntok["qwen3-embedding-small-F16"])
        compare("stories260K_mean", "models/stories260K.gguf", "stories260K-mean.json", ntok["stories260K-mean"],
                "--pooling", "mean")
        p = lamina("embed", "-m", "models/stories260K.gguf", "-p", "Once upon a time")
        result("chat_model_needs_pooling", p.returncode == 1 and b"generative model" in p.stderr, p.stderr)

        p = lamina("embed", "-m", model, "-f", INPUTS, "--no-normalize")
        raw = [d["embedding"] for d in json.loads(p.stdout)["data"]] if p.returncode == 0 else []
        ok = vecs is not None and len(raw) == len(vecs) and all(abs(norm(r) - 1) > 1e-3 for r in raw)
        ok = ok and all(abs(a / norm(r) - b) < 1e-6 for r, v in zip(raw, vecs) for a, b in zip(r, v))
        result("no_normalize_is_raw", ok, p.stderr)
        p = lamina("embed", "-m", model, "-f", INPUTS, "--dimensions", "32", "-o", "text")
        rows = [[float(x) for x in line.split()] for line in p.stdout.decode().splitlines()]
        ok = p.returncode == 0 and len(rows) == len(raw) and all(len(r) == 32 for r in rows)
        ok = ok and all(abs(a - b / norm(r[:32])) < 1e-6 for row, r in zip(rows, raw) for a, b in zip(row, r[:32]))
        result("dimensions_text", ok, p.stdout[:300] + p.stderr)

        out = os.path.join(tmp, "out.json")
        p = lamina("embed", "-m", model, "-f", INPUTS, "--out", out)
        q = lamina("embed", "-m", model, "-f", INPUTS)
        same = p.returncode == 0 and os.path.exists(out) and open(out, "rb").read() == q.stdout
        result("out_file_is_stdout", same, p.stderr)
        copy = os.path.join(tmp, "inputs.txt")
        with open(copy, "wb") as f:
            f.write(open(INPUTS, "rb").read())
        p = lamina("embed", "-m", model, "-f", copy, "--out", copy)
        result("out_onto_input_refused", p.returncode == 1 and open(copy, "rb").read() == open(INPUTS, "rb").read(),
               p.stderr)
        encoders(tmp)
    return summary()


if __name__ == "__main__":
    sys.exit(main())
