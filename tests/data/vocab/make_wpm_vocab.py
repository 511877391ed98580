#!/usr/bin/env python3
"""
make_wpm_vocab.py - writes tests/data/vocab/ggml-vocab-wpm.gguf, a small
WordPiece (tokenizer.ggml.model "bert") vocabulary of our own, and with
--facts its .out: the token ids llama.cpp's llama-tokenize gives for each
case of ggml-vocab-wpm.gguf.inp (no [CLS]/[SEP] added, specials not parsed).

The vocabulary, in the GGUF convention llama.cpp's converter uses (a word's
first piece stored as "\u2581piece", a "##" continuation stored bare):
  - [PAD] [UNK] [CLS] [SEP] [MASK] (ids 0..4, control tokens);
  - every printable ASCII character, and a few CJK ideographs and other
    letters, both as a word start and as a continuation;
  - the English words and word pieces below, as word starts, and the
    suffixes below as continuations.
Keys: general.architecture "bert" with a bert.* header (so llama.cpp's
vocab-only tools load it), cls/seperator/unknown/padding/mask ids, the
normalizer's lowercase (true), token_type_count 2.

Run from the repository root with the gguf package from PyPI:
  python3 -m venv /tmp/venv && /tmp/venv/bin/pip install gguf
  /tmp/venv/bin/python tests/data/vocab/make_wpm_vocab.py
  /tmp/venv/bin/python tests/data/vocab/make_wpm_vocab.py --facts \\
      --tokenize /work/llama.cpp/build/bin/llama-tokenize
"""
import argparse
import os
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "ggml-vocab-wpm.gguf")
SEP = "\n__ggml_vocab_test__\n"
MARK = "\u2581"

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
EXTRA_CHARS = "\u4e2d\u6587\u5b57\u65e5\u672c\u00e6\u00f8\u00df\u03b1\u03b2\u03b3\u0430\u0431\u0432"
WORDS = """
the a an and or of to in on at for with by from is are was were be been it its this that these those
he she they we you i my your our their his her not no yes all some any each every one two three four
five six seven eight nine ten hello world quick brown fox jump jumps jumped over lazy dog cat cats
run running runs ran walk walked walking talk token tokens tokenizer word words piece pieces text
model models embed embedding embeddings vector vectors sentence sentences search query document
documents language languages learn learning machine deep net network networks neural attention
layer layers cafe resume naive über over under very good bad new old first last time day year
people way thing man woman child world life hand part place case week point number group problem
fact un re pre dis in im play play played playing player players read reading writer write written
happy happiness unhappy kind kindness go going gone went come came coming see saw seen look looked
""".split()
SUFFIXES = """s es ed ing er ers est ly ness ment ments able ible tion tions ize ized izer izing al ful less
y ie ies n t d e r l o a i u st nd th ch sh ph qu""".split()

CASES = [
    "",
    " ",
    "  ",
    "\t",
    "\n",
    "\n\n\n",
    "Hello world",
    " Hello world",
    "Hello World",
    "HELLO WORLD!",
    "hello, world.",
    "The quick brown fox jumps over the lazy dog.",
    "The QUICK brown fox jumped over the lazy dogs!!",
    "playing players played replay unplayed",
    "tokenizers tokenize tokenized tokenization",
    "happiness unhappy kindness",
    "Caf\u00e9 r\u00e9sum\u00e9 na\u00efve \u00fcber",
    "CAF\u00c9 \u00c0 la carte",
    "$100 + 20% = <value> ^ `x` | ~y",
    "a-b_c/d\\e@f#g&h*i(j)k[l]m{n}o",
    "don't won't it's",
    "email: someone@example.com",
    "\u4e2d\u6587\u5b57 and \u65e5\u672c",
    "\u4e2d\u6587abc\u65e5\u672c123",
    "\u00e6 \u00f8 \u00df \u03b1\u03b2\u03b3 \u0430\u0431\u0432",
    "\u0391\u0392\u0393 \u0410\u0411\u0412",
    "emoji \U0001F600 here",
    "zzzzqqqq xylophone",
    "walking talking stalking",
    "   leading and trailing   ",
    "tab\tseparated\twords",
    "line one\nline two\r\nline three",
    "non\u00a0breaking\u2003spaces\u3000here",
    "zero\u200bwidth\u200djoiner",
    "control\x01chars\x7fhere",
    "1234567890",
    "3.14159 2,718",
    "...!!!???",
    "\u201cquoted\u201d \u2018single\u2019 \u2014 dash \u2026",
    "\u00bfQu\u00e9? \u00a1S\u00ed!",
    "mixedCASEwords ALLCAPS lowercase",
    "a" * 60,
    "supercalifragilisticexpialidocious",
    "the the the the the the the the",
    "n\u0303 e\u0301 combining marks",
    "[CLS] [SEP] [UNK] literally",
    "deep learning models embed sentences into vectors for search",
    "Embeddings: documents, queries & vectors (2024).",
]


def build_vocab():
    vocab = list(SPECIALS)
    seen = set(vocab)

    def add(t):
        if t not in seen:
            seen.add(t)
            vocab.append(t)

    chars = [chr(c) for c in range(0x21, 0x7F)] + list(EXTRA_CHARS)
    for c in chars:
        add(MARK + c.lower())
    for c in chars:
        add(c.lower())
    for w in WORDS:
        add(MARK + w)
    for s in SUFFIXES:
        add(s)
    return vocab


def write_gguf(path):
    import gguf
    vocab = build_vocab()
    types = [gguf.TokenType.CONTROL] * len(SPECIALS) + [gguf.TokenType.NORMAL] * (len(vocab) - len(SPECIALS))
    w = gguf.GGUFWriter(path, "bert")
    w.add_string("general.name", "lamina WordPiece test vocabulary")
    w.add_uint32("bert.block_count", 1)
    w.add_uint32("bert.context_length", 512)
    w.add_uint32("bert.embedding_length", 64)
    w.add_uint32("bert.feed_forward_length", 128)
    w.add_uint32("bert.attention.head_count", 2)
    w.add_float32("bert.attention.layer_norm_epsilon", 1e-12)
    w.add_bool("bert.attention.causal", False)
    w.add_tokenizer_model("bert")
    w.add_tokenizer_pre("default")
    w.add_token_list(vocab)
    w.add_token_types(types)
    w.add_uint32("tokenizer.ggml.token_type_count", 2)
    w.add_uint32("tokenizer.ggml.cls_token_id", SPECIALS.index("[CLS]"))
    w.add_uint32("tokenizer.ggml.bos_token_id", SPECIALS.index("[CLS]"))
    w.add_uint32("tokenizer.ggml.seperator_token_id", SPECIALS.index("[SEP]"))
    w.add_uint32("tokenizer.ggml.unknown_token_id", SPECIALS.index("[UNK]"))
    w.add_uint32("tokenizer.ggml.padding_token_id", SPECIALS.index("[PAD]"))
    w.add_uint32("tokenizer.ggml.mask_token_id", SPECIALS.index("[MASK]"))
    w.add_bool("tokenizer.ggml.normalizer.lowercase", True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"{path}: {len(vocab)} tokens, {os.path.getsize(path)} bytes")


def record(path, tokenize):
    with open(path + ".inp", "w", encoding="utf-8", newline="") as f:
        for c in CASES:
            f.write(c + SEP)
    lines = []
    for c in CASES:
        r = subprocess.run([tokenize, "-m", path, "--stdin", "--ids", "--no-bos", "--no-parse-special",
                            "--log-disable"],
                           input=c.encode("utf-8"), capture_output=True, check=True)
        ids = r.stdout.decode().strip().strip("[]").replace(",", " ").split()
        lines.append(" ".join(ids))
    with open(path + ".out", "w") as f:
        for l in lines:
            f.write((" " + l if l else "") + "\n")
    print(f"{path}.out: {len(lines)} cases")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("--out", default=OUT)
    ap.add_argument("--facts", action="store_true", help="also write .inp and the .out llama-tokenize gives")
    ap.add_argument("--tokenize", default="llama-tokenize", help="llama.cpp's llama-tokenize")
    a = ap.parse_args()
    write_gguf(a.out)
    if a.facts:
        record(a.out, a.tokenize)


if __name__ == "__main__":
    main()
