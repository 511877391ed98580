#!/usr/bin/env python3
"""lamina against llama.cpp on the deepseek2 (multi-head latent attention)
files lamina mkmodel builds: the checks of tests/e2e_arch.py (its docstring
says what they are and their tolerances) on deepseek2-small, F16 and Q8_0,
with the facts of tests/data/deepseek2/ (README.md there says how they were
made). The preset carries YaRN scaling as DeepSeek's files do (factor 16 from
256 original positions), so the perplexity's 512 positions and the long
prompt (about 300 tokens, then 24 greedy steps) run past the original
context. Then:
  - the older layout (attn_kv_b whole, no *_length_mla keys; mkmodel
    --kv-b-whole, F16, the same weights): its sha256, lamina's logits and
    greedy tokens against llama.cpp's on that file (llama.cpp runs it through
    its decompressed multi-head path), and lamina's logits on it identical to
    its logits on the split file;
  - `lamina kv` on the same file: the latent cache's bytes per token equal
    n_layer x (kv_lora_rank + n_rot) x bytes per element, against the
    multi-head cache the same attention would need without the latent."""
import os
import re
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e_arch  # noqa: E402 (tests/ is the script's folder)
from testenv import result, summary  # noqa: E402

# deepseek2-small: 4 layers, 4 heads, kv_lora_rank 128, RoPE key 32, a head's key 64 + 32 and value 64
LAYERS, HEADS, RANK, ROPE, QK, VD = 4, 4, 128, 32, 96, 64
ELEM = {"F32": 4.0, "F16": 2.0, "Q8_0": 34.0 / 32}


def check_kv(tmp):
    vocab = os.path.join(e2e_arch.DATA, "vocab", e2e_arch.DEFAULT_VOCAB)
    model = os.path.join(tmp, "deepseek2-kv.gguf")
    r = e2e_arch.lamina("mkmodel", "--preset", "deepseek2-small", "--type", "Q8_0", "--vocab-from", vocab, "-o", model)
    if r.returncode != 0:
        result("deepseek2 kv: model written", False, r.stderr.decode())
        return
    for t, e in ELEM.items():
        r = e2e_arch.lamina("kv", "-m", model, "--kv-type", t, "-c", "1024")
        out = r.stdout.decode()
        want = int(LAYERS * (RANK + ROPE) * e)
        mha = int(LAYERS * HEADS * (QK + VD) * e)
        got = re.search(r"KV per token:.* = (\d+) bytes \(latent attention\)", out)
        alt = re.search(r"instead of:\s+MHA .* = (\d+) bytes", out)
        pool = re.search(r"pool:\s+(\d+) blocks = (\d+) tokens = (\d+) bytes", out)
        ok = (r.returncode == 0 and got and alt and pool and int(got.group(1)) == want and int(alt.group(1)) == mha
              and int(pool.group(3)) == int(pool.group(2)) * want)
        print("NOTE deepseek2-small %s KV per token: %d bytes latent, %d bytes as multi-head attention (%.1fx)"
              % (t, want, mha, mha / want))
        result("deepseek2 kv %s: latent bytes per token and pool" % t, bool(ok), out + r.stderr.decode())
    os.unlink(model)


KV_B = "F16 kv_b whole"  # the facts' section of the older layout's file


def check_kv_b_whole(tmp):
    facts, _ = e2e_arch.read_facts("deepseek2")
    vocab = os.path.join(e2e_arch.DATA, "vocab", e2e_arch.DEFAULT_VOCAB)
    paths = {}
    for layout, extra in (("split", []), ("whole", ["--kv-b-whole"])):
        paths[layout] = os.path.join(tmp, "deepseek2-%s.gguf" % layout)
        r = e2e_arch.lamina("mkmodel", "--preset", "deepseek2-small", "--type", "F16", "--vocab-from", vocab,
                            "-o", paths[layout], *extra)
        if r.returncode != 0:
            result("deepseek2 kv_b %s file written" % layout, False, r.stderr.decode())
            return
    sha = e2e_arch.sha256(paths["whole"])
    result("deepseek2 %s file is the recorded one" % KV_B, sha == facts[KV_B]["sha256"],
           "sha256 %s, recorded %s" % (sha, facts[KV_B]["sha256"]))
    if sha != facts[KV_B]["sha256"]:
        return
    for c in facts[KV_B]["prompts"]:
        e2e_arch.check_logits("deepseek2 kv_b whole", "F16", paths["whole"], c)
        if not os.environ.get("LAMINA_ASAN"):
            e2e_arch.check_greedy("deepseek2 kv_b whole", "F16", paths["whole"], c)
    prompt = facts[KV_B]["prompts"][0]["prompt"]
    outs = [e2e_arch.lamina("logits", "-m", paths[k], "-p", prompt, "--top", "10", "-c", "512").stdout
            for k in ("split", "whole")]
    result("deepseek2 kv_b whole: the split file's logits, bit for bit", outs[0] == outs[1] and b"top:" in outs[0],
           "%s\n%s" % (outs[0].decode(), outs[1].decode()))


def main():
    with tempfile.TemporaryDirectory(prefix="lamina_mla_") as tmp:
        e2e_arch.check_arch("deepseek2", tmp)
        check_kv_b_whole(tmp)
        check_kv(tmp)
    return summary()


if __name__ == "__main__":
    sys.exit(main())
