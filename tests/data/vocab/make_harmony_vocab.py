#!/usr/bin/env python3
"""
make_harmony_vocab.py - writes tests/data/vocab/ggml-vocab-harmony.gguf, a
small stand-in for gpt-oss's o200k_harmony vocabulary (there is no o200k
file here): GPT-2's byte-level BPE cut to its first --merges merges, with
the harmony special tokens after it and the "gpt-4o" pre-tokenizer.

From ggml-vocab-gpt-2.gguf (beside this script):
  - tokens 0..255 (the bytes) and 256..256+K-1, where GPT-2's merge i makes
    token 256+i (checked), with the first K merges: a consistent BPE, since
    every kept merge joins kept tokens; GPT-2's <|endoftext|> is left out;
  - then the o200k_harmony specials in their order there (<|startoftext|>
    199998 ... <|call|> 200012, reserved ids included), control tokens:
    <|startoftext|> <|endoftext|> <|reserved_200000|> <|reserved_200001|>
    <|return|> <|constrain|> <|reserved_200004|> <|channel|> <|start|>
    <|end|> <|message|> <|reserved_200009|> <|reserved_200010|>
    <|reserved_200011|> <|call|>;
  - BOS <|startoftext|>, EOS <|return|>, padding <|endoftext|>, no BOS added
    (gpt-oss's prompts begin with <|start|>), tokenizer.ggml.pre "gpt-4o";
  - every other key (general.*, gpt2.* hyperparameters) as in the source,
    so that llama.cpp's vocab-only tools load the file too.
No chat template is stored: lamina renders gpt-oss by family name.

Run from the repository root with the gguf package from PyPI:
  python3 -m venv /tmp/venv && /tmp/venv/bin/pip install gguf
  /tmp/venv/bin/python tests/data/vocab/make_harmony_vocab.py
"""
import argparse
import os

import gguf

HERE = os.path.dirname(os.path.abspath(__file__))
SPECIALS = ["<|startoftext|>", "<|endoftext|>", "<|reserved_200000|>", "<|reserved_200001|>", "<|return|>",
            "<|constrain|>", "<|reserved_200004|>", "<|channel|>", "<|start|>", "<|end|>", "<|message|>",
            "<|reserved_200009|>", "<|reserved_200010|>", "<|reserved_200011|>", "<|call|>"]
TOKENIZER_KEYS = ("tokenizer.",)


def field_value(f):
    """A scalar or string field's value, an array's list."""
    t = f.types[0]
    if t == gguf.GGUFValueType.ARRAY:
        if f.types[1] == gguf.GGUFValueType.STRING:
            return [bytes(f.parts[i]).decode("utf-8") for i in f.data]
        return [f.parts[i].tolist()[0] for i in f.data]
    if t == gguf.GGUFValueType.STRING:
        return bytes(f.parts[f.data[0]]).decode("utf-8")
    return f.parts[f.data[0]].tolist()[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("--src", default=os.path.join(HERE, "ggml-vocab-gpt-2.gguf"))
    ap.add_argument("--out", default=os.path.join(HERE, "ggml-vocab-harmony.gguf"))
    ap.add_argument("--merges", type=int, default=4096, help="GPT-2 merges kept (its first K)")
    a = ap.parse_args()

    r = gguf.GGUFReader(a.src)
    tokens = field_value(r.fields["tokenizer.ggml.tokens"])
    merges = field_value(r.fields["tokenizer.ggml.merges"])
    k = a.merges
    if not 0 < k <= len(merges):
        raise SystemExit(f"--merges must be in 1..{len(merges)}")
    index = {t: i for i, t in enumerate(tokens)}
    for i, m in enumerate(merges[:k]):
        left, right = m.split(" ")
        if index.get(left + right) != 256 + i or index[left] >= 256 + i or index[right] >= 256 + i:
            raise SystemExit(f"merge {i} ({m!r}) does not make token {256 + i}: the cut would not be a BPE")
    kept = tokens[:256 + k]
    vocab = kept + SPECIALS
    types = [gguf.TokenType.NORMAL] * len(kept) + [gguf.TokenType.CONTROL] * len(SPECIALS)
    first = len(kept)

    arch = field_value(r.fields["general.architecture"])
    w = gguf.GGUFWriter(a.out, arch)
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name.startswith(TOKENIZER_KEYS) or name in ("general.architecture", "general.name"):
            continue
        t = f.types[0]
        if t == gguf.GGUFValueType.STRING:
            w.add_string(name, field_value(f))
        elif t == gguf.GGUFValueType.UINT32:
            w.add_uint32(name, field_value(f))
        elif t == gguf.GGUFValueType.FLOAT32:
            w.add_float32(name, field_value(f))
        else:
            raise SystemExit(f"{name}: type {t} not copied")
    w.add_string("general.name", "o200k_harmony test vocabulary (GPT-2 BPE cut to %d merges)" % k)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-4o")
    w.add_token_list(vocab)
    w.add_token_types(types)
    w.add_token_merges(merges[:k])
    w.add_bos_token_id(first + SPECIALS.index("<|startoftext|>"))
    w.add_eos_token_id(first + SPECIALS.index("<|return|>"))
    w.add_pad_token_id(first + SPECIALS.index("<|endoftext|>"))
    w.add_add_bos_token(False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"{a.out}: {len(vocab)} tokens ({k} merges, specials from {first}), {os.path.getsize(a.out)} bytes")


if __name__ == "__main__":
    main()
