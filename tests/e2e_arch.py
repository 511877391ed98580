#!/usr/bin/env python3
"""lamina against llama.cpp on the architectures lamina mkmodel builds: qwen3,
gemma2 and phi3 here (tests/e2e_arch_moe.py runs the Mixture-of-Experts ones
through main() below). The reference facts, and how they were made, are in
tests/data/<arch>/ and tests/data/arch_README.md.

For each architecture and weight type (F16, and Q8_0 as the quantized type;
the hybrid ones, qwen35, qwen35moe and qwen3next, included; qwen35 and
qwen35moe also at Q4_K, a K-quant, with wider tolerances: TOL's comment says
why):
  - the file: `lamina mkmodel --preset <arch>-small --type T --vocab-from V`
    written into a temporary folder must have the recorded sha256 (the facts
    belong to those bytes; a change to mkmodel that moves them needs new
    facts);
  - logits: for each recorded prompt, the prompt's ids are llama.cpp's, and
    each of llama.cpp's five largest first-step logits is among lamina's ten
    largest with a value within TOL[type] (absolute + relative part);
  - greedy: lamina's greedy tokens (F16 KV cache, as llama.cpp's) equal
    llama.cpp's at least up to the first step whose top-1/top-2 margin in
    llama.cpp is under the near-tie bound (a closer call may go either way
    between two correct implementations): NEAR_TIE_F16 for F16 weights, and
    twice the logit tolerance for Q8_0, whose 8-bit activations move each
    logit by up to about 1%;
  - perplexity: llama-perplexity's method on tests/data/gemma3/ppl_text.txt,
    the first PPL_CHUNKS chunks of 512, within PPL_TOL[type] of llama.cpp's
    (PPL_TOL_MOE with experts);
  - an older layout of the same weights (OLDER: qwen3next's ssm_in, q, k, v
    and z interleaved per key head): lamina's ten largest logits on every
    prompt are those of the file above, to the printed digit, and so within
    TOL of llama.cpp's;
  - gpt-oss, F16: the file with every attention sink -inf runs, and with
    one sink made NaN it is refused, naming the tensor;
  - hybrids (HYBRID), F16: the file with its layer pattern spelled out
    (mkmodel --recurrent-layers, attention.recurrent_layers) gives the same
    ten largest logits on the first prompt, and with layer 0's flag flipped
    in the file's bytes it is refused with a message naming the key.
Under AddressSanitizer (LAMINA_ASAN set) only the file and F16 logits checks run;
under emulation (LAMINA_EMULATED set: `make test-arm` runs the hybrid ones
with LAMINA_BIN="qemu-aarch64 build/arm64/lamina") the file and F16 logits
checks and the first prompt's greedy check (no older layout or pattern). LAMINA_BIN may hold a wrapper
command before the binary, as tests/run.sh sets it.
"""
import hashlib
import os
import re
import shlex
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from testenv import result, skip, summary  # noqa: E402 (tests/ is the script's folder)

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "data")
LAMINA = shlex.split(os.environ.get("LAMINA_BIN", "build/lamina"))
PPL_TEXT = os.path.join(DATA, "gemma3", "ppl_text.txt")
VOCAB = {"qwen3": "ggml-vocab-gpt-2.gguf", "qwen3moe": "ggml-vocab-gpt-2.gguf", "phi3": "ggml-vocab-phi-3.gguf",
         "qwen35": "ggml-vocab-gpt-2.gguf", "qwen35moe": "ggml-vocab-gpt-2.gguf",
         "qwen3next": "ggml-vocab-gpt-2.gguf", "gpt-oss": "ggml-vocab-gpt-2.gguf"}
DEFAULT_VOCAB = "ggml-vocab-llama-spm.gguf"
# Q4_K: the hybrid files only (a section of their facts; mkmodel writes Q8_0
# where a row is not a multiple of 256 weights, as the experts' down rows of
# 128, and llama.cpp's quantizer does the same).
TYPES = ["F16", "Q8_0", "Q4_K"]
# Q4_K's 8-bit activations come in blocks of 256 with one scale, so a small
# difference upstream flips more of their roundings. In these files' first-step
# logits of about 4, llama.cpp's own two Q4_K paths (repacked weights, its
# default, and -nr) differ by up to 0.09, and its Q4_K logits lie up to 0.25
# from both engines' on the same weights dequantized to F32 (which agree to
# 1e-4), lamina's up to 0.07; Q4_K allows 0.25 at a logit of 4.
TOL = {"F16": (0.02, 0.002), "Q8_0": (0.03, 0.012), "Q4_K": (0.05, 0.05)}   # |lamina - llama.cpp| <= a + r * |logit|
TOP = {"Q4_K": 20}   # lamina's largest logits among which llama.cpp's five must be (10 otherwise)
NEAR_TIE_F16 = 0.02   # Q8_0: twice the logit tolerance at the size of the first step's top logit
PPL_CHUNKS = 2
PPL_TOL = {"F16": 0.002, "Q8_0": 0.01, "Q4_K": 0.01}
# With experts, a token whose router scores nearly tie may run another expert
# in one implementation than in the other (0.4% on qwen3moe's 510 scored
# tokens at F16); the logits checks above see no such flip.
# At Q8_0 a change of summation order alone moves it further: attention
# summed over 256-key splits (kv/attn.h) instead of one running softmax left
# deepseek2-small's F16 perplexity within 5e-7 but moved its Q8_0 one by 0.9%
# (8-bit activations round the other way, and a router then picks another
# expert), from 0.6% to 1.5% off llama.cpp's; Q8_0 with experts allows 2%.
PPL_TOL_MOE = {"F16": 0.01, "Q8_0": 0.02, "Q4_K": 0.01}
MOE = {"qwen3moe", "qwen2moe", "mixtral", "deepseek2", "qwen35moe", "qwen3next", "gpt-oss"}
# mkmodel flags of the files the facts were made on, beyond the preset and type
FLAGS = {}
# Architectures whose files of every type hold 8-bit-activation products: gpt-oss's experts are
# MXFP4 whatever --type says (the other matrices), multiplied against activations quantized to 8
# bits as Q8_0's are, so its F16 file takes Q8_0's logit tolerance and near-tie bound.
TOL_AS = {"gpt-oss": "Q8_0"}
# Greedy steps where a router's choice nearly ties, measured in llama.cpp (its ffn_moe_probs through
# an eval callback): the step from which the two engines may continue apart although no logit margin
# is small ({(arch, type, prompt): step}; none recorded now).
ROUTER_TIE = {}
OLDER = {"qwen3next": "--ssm-in"}
HYBRID = {"qwen35", "qwen35moe", "qwen3next"}  # mkmodel's flag for the same weights in an older conversion's layout

def lamina(*args, timeout=300):
    return subprocess.run([*LAMINA, *args], capture_output=True, timeout=timeout)


def read_facts(arch):
    """{type: {"sha256": str, "prompts": [dict]}, "ppl": {type: float}}"""
    facts, cur, sec = {}, None, None
    with open(os.path.join(DATA, arch, "greedy.txt"), encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            if line.startswith("## type "):
                sec = facts.setdefault(line[8:].strip(), {"prompts": []})
                cur = None
            elif line.startswith("sha256: "):
                sec["sha256"] = line[8:].strip()
            elif line.startswith("prompt: "):
                cur = {"prompt": line[8:]}
                sec["prompts"].append(cur)
            elif cur is not None and ": " in line and not line.startswith("#"):
                k, v = line.split(": ", 1)
                cur[k] = v
    ppl = {}
    with open(os.path.join(DATA, arch, "perplexity.txt"), encoding="utf-8") as f:
        text = f.read()
    for t in TYPES:
        m = re.search(r"## type %s\n(?:.*\n)*?running: (.*)" % re.escape(t), text)
        if m:
            ppl[t] = float(re.search(r"\[%d\]([0-9.]+)" % PPL_CHUNKS, m.group(1)).group(1))
    return facts, ppl


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def short(prompt):
    """A prompt as check names show it (long prompts cut to their start)."""
    return repr(prompt if len(prompt) <= 40 else prompt[:36] + "...")


def check_logits(arch, t, model, c):
    r = lamina("logits", "-m", model, "-p", c["prompt"], "--top", str(TOP.get(t, 10)), "-c", "512", "--kv-type", "F16")
    out = r.stdout.decode()
    m = re.search(r"prompt ids: (.*)\ntop: (.*)", out)
    name = "%s %s logits %s" % (arch, t, short(c["prompt"]))
    if r.returncode != 0 or not m:
        result(name, False, r.stderr.decode())
        return
    ids = m.group(1).split()
    got = {int(p.split(":")[0]): float(p.split(":")[1]) for p in m.group(2).split()}
    a, rel = TOL[TOL_AS.get(arch, t)]
    bad, worst = [], 0.0
    for p in c["first_step_top5"].split():
        i, v = int(p.split(":")[0]), float(p.split(":")[1])
        d = abs(got[i] - v) if i in got else float("inf")
        worst = max(worst, d)
        if d > a + rel * abs(v):
            bad.append("%d: llama.cpp %.4f, lamina %s" % (i, v, "%.4f" % got[i] if i in got else "not in its top %d" % len(got)))
    print("NOTE %s %s %-28s largest logit difference %.4f" % (arch, t, short(c["prompt"]), worst))
    result(name, ids == c["prompt_ids"].split() and not bad,
           "prompt ids %s vs %s; %s" % (ids, c["prompt_ids"], "; ".join(bad)))


def near_tie(arch, t, c):
    t = TOL_AS.get(arch, t)
    if t == "F16":
        return NEAR_TIE_F16
    a, rel = TOL[t]
    top = abs(float(c["first_step_top5"].split()[0].split(":")[1]))
    return 2 * (a + rel * top)


def check_greedy(arch, t, model, c):
    ref = [int(x) for x in c["greedy_ids"].split()]
    margins = [float(x) for x in c["margins"].split()]
    r = lamina("run", "-m", model, "-p", c["prompt"], "-n", str(len(ref)), "--temp", "0", "--kv-type", "F16",
               "--ignore-eos", "--show-ids", "-c", "512")
    err = r.stderr.decode()
    m = re.search(r"generated ids:([0-9 ]*)", err)
    name = "%s %s greedy %s" % (arch, t, short(c["prompt"]))
    if r.returncode != 0 or not m:
        result(name, False, err)
        return
    gen = [int(x) for x in m.group(1).split()]
    same = 0
    while same < min(len(gen), len(ref)) and gen[same] == ref[same]:
        same += 1
    tie = near_tie(arch, t, c)
    first_tie = next((i for i, mg in enumerate(margins) if mg < tie), len(ref))
    first_tie = min(first_tie, ROUTER_TIE.get((arch, t, c["prompt"]), len(ref)))
    print("NOTE %s %s greedy %-28s identical for %2d of %d; llama.cpp's first margin under %.2f at step %d"
          % (arch, t, short(c["prompt"]), same, len(ref), tie, first_tie))
    result(name, same >= first_tie, "identical for %d, first near-tie at %d" % (same, first_tie))


def check_perplexity(arch, t, model, ref):
    r = lamina("perplexity", "-m", model, "-f", PPL_TEXT, "-c", "512", "--chunks", str(PPL_CHUNKS), "--kv-type", "F16")
    m = re.search(r"\[%d\]([0-9.]+)" % PPL_CHUNKS, r.stdout.decode())
    name = "%s %s perplexity" % (arch, t)
    if r.returncode != 0 or not m:
        result(name, False, r.stderr.decode())
        return
    ppl = float(m.group(1))
    d = abs(ppl - ref) / ref
    print("NOTE %s %s perplexity, %d chunks of 512: lamina %.4f, llama.cpp %.4f, difference %.3f%%"
          % (arch, t, PPL_CHUNKS, ppl, ref, 100 * d))
    tol = (PPL_TOL_MOE if arch in MOE else PPL_TOL)[t]
    result(name, d <= tol, "lamina %.4f vs llama.cpp %.4f, tolerance %.1f%%" % (ppl, ref, 100 * tol))


# The MoE presets' shapes: n_embd, q width, kv width, experts, used, expert width,
# shared expert width, vocabulary (the head is tied for qwen3moe), layers.
MOE_SHAPE = {"qwen3moe": (256, 512, 256, 8, 2, 256, 0, 50257, True, 4),
             "qwen2moe": (256, 256, 256, 8, 4, 128, 512, 32000, False, 4),
             "mixtral": (256, 256, 64, 8, 2, 512, 0, 32000, False, 4),
             "gpt-oss": (256, 512, 128, 32, 4, 256, 0, 50257, False, 4)}


def check_bench_bytes(arch, model):
    """lamina bench's active and total weight bytes per token, against the
    preset's shape at Q8_0 (34 bytes per 32 weights; the router is F32;
    gpt-oss's experts MXFP4, 17 bytes per 32)."""
    E, Q, KV, X, K, FE, S, V, tied, L = MOE_SHAPE[arch]
    q8 = lambda rows, cols: rows * cols // 32 * 34
    attn = q8(Q, E) + 2 * q8(KV, E) + q8(E, Q)
    shared = 2 * q8(S, E) + q8(E, S) if S else 0
    xb = 17 if arch == "gpt-oss" else 34
    expert = (2 * FE * E + E * FE) // 32 * xb
    router = X * E * 4
    head = q8(V, E)
    active = L * (attn + shared + router + K * expert) + head
    total = L * (attn + shared + router + X * expert) + head
    r = lamina("bench", "-m", model, "-p", "8", "-n", "2", "-r", "1", "--no-bw", "-o", "json")
    import json
    try:
        j = json.loads(r.stdout.decode())
    except ValueError:
        result("%s bench bytes" % arch, False, r.stderr.decode())
        return
    ok = (j.get("active_weight_bytes_per_token") == active and j.get("total_weight_bytes_per_token") == total
          and j.get("weight_bytes_per_token") == active and j.get("experts_used") == K)
    print("NOTE %s Q8_0 weights per token: %d active of %d total bytes" % (arch, active, total))
    result("%s bench: active and total weight bytes per token" % arch, ok,
           "want %d / %d, got %s" % (active, total, {k: v for k, v in j.items() if "bytes" in k}))


def top10(model, prompt):
    r = lamina("logits", "-m", model, "-p", prompt, "--top", "10", "-c", "512", "--kv-type", "F16")
    m = re.search(r"top: (.*)", r.stdout.decode())
    return m.group(1) if r.returncode == 0 and m else r.stderr.decode()


def check_older(arch, t, vocab, model, facts, tmp):
    older = os.path.join(tmp, "%s-%s-older.gguf" % (arch, t))
    r = lamina("mkmodel", "--preset", arch + "-small", "--type", t, "--vocab-from", vocab, OLDER[arch], "-o", older)
    if not result("%s %s %s file written" % (arch, t, OLDER[arch]), r.returncode == 0, r.stderr.decode()):
        return
    for c in facts[t]["prompts"]:
        check_logits(arch + " " + OLDER[arch], t, older, c)
        a, b = top10(model, c["prompt"]), top10(older, c["prompt"])
        result("%s %s %s logits %s: the other layout's" % (arch, t, OLDER[arch], short(c["prompt"])), a == b,
               "%s vs %s" % (a, b))
    os.unlink(older)


def check_pattern(arch, vocab, model, c, tmp):
    spelled = os.path.join(tmp, "%s-pattern.gguf" % arch)
    r = lamina("mkmodel", "--preset", arch + "-small", "--type", "F16", "--vocab-from", vocab, "--recurrent-layers",
               "-o", spelled)
    if not result("%s --recurrent-layers file written" % arch, r.returncode == 0, r.stderr.decode()):
        return
    a, b = top10(model, c["prompt"]), top10(spelled, c["prompt"])
    result("%s attention.recurrent_layers as the interval says: the same logits" % arch, a == b, "%s vs %s" % (a, b))
    key = ("%s.attention.recurrent_layers" % arch).encode()
    with open(spelled, "rb") as f:
        buf = bytearray(f.read())
    at = buf.find(key) + len(key) + 4 + 4 + 8  # type 9, element type 7 (bool), count: then layer 0's flag
    ok_before = buf.find(key) > 0 and buf[at] == 1
    buf[at] = 0
    with open(spelled, "wb") as f:
        f.write(buf)
    r = lamina("logits", "-m", spelled, "-p", c["prompt"], "--top", "1", "-c", "512")
    err = r.stderr.decode()
    result("%s attention.recurrent_layers of another pattern: refused by name" % arch,
           ok_before and r.returncode != 0 and "recurrent_layers" in err and "layer 0" in err, err)
    os.unlink(spelled)


def check_bad_sink(vocab, c, tmp):
    """gpt-oss: the file with every sink -inf (mkmodel --no-sinks) runs; with
    one of layer 0's sinks made NaN in its bytes it is refused, naming the
    tensor."""
    path = os.path.join(tmp, "gpt-oss-nosinks.gguf")
    r = lamina("mkmodel", "--preset", "gpt-oss-small", "--type", "F16", "--vocab-from", vocab, "--no-sinks", "-o", path)
    if not result("gpt-oss --no-sinks file written", r.returncode == 0, r.stderr.decode()):
        return
    r = lamina("logits", "-m", path, "-p", c["prompt"], "--top", "1", "-c", "512")
    result("gpt-oss sinks of -inf run", r.returncode == 0, r.stderr.decode())
    with open(path, "rb") as f:
        buf = bytearray(f.read())
    at = buf.find(b"\x00\x00\x80\xff" * 8)  # layer 0's 8 sinks, -inf as F32, the first such run
    if at >= 0:
        buf[at + 12:at + 16] = b"\x00\x00\xc0\x7f"  # head 3: NaN
        with open(path, "wb") as f:
            f.write(buf)
    r = lamina("logits", "-m", path, "-p", c["prompt"], "--top", "1", "-c", "512")
    err = r.stderr.decode()
    result("gpt-oss a NaN attention sink: refused by name", at >= 0 and r.returncode != 0 and
           "blk.0.attn_sinks.weight" in err, err)
    os.unlink(path)


def check_arch(arch, tmp):
    facts, ppl = read_facts(arch)
    vocab = os.path.join(DATA, "vocab", VOCAB.get(arch, DEFAULT_VOCAB))
    asan, emulated = bool(os.environ.get("LAMINA_ASAN")), bool(os.environ.get("LAMINA_EMULATED"))
    for t in [t for t in TYPES if t in facts] if not (asan or emulated) else ["F16"]:
        model = os.path.join(tmp, "%s-%s.gguf" % (arch, t))
        r = lamina("mkmodel", "--preset", arch + "-small", "--type", t, "--vocab-from", vocab, *FLAGS.get(arch, []),
                   "-o", model)
        ok = r.returncode == 0 and sha256(model) == facts[t]["sha256"]
        result("%s %s file is the recorded one" % (arch, t), ok, r.stderr.decode() if r.returncode else
               "sha256 %s, recorded %s" % (sha256(model), facts[t]["sha256"]))
        if not ok:
            continue
        for i, c in enumerate(facts[t]["prompts"]):
            check_logits(arch, t, model, c)
            if not asan and (not emulated or i == 0):
                check_greedy(arch, t, model, c)
        if not (asan or emulated):
            check_perplexity(arch, t, model, ppl[t])
        if arch in MOE_SHAPE and t == "Q8_0":
            check_bench_bytes(arch, model)
        if arch in OLDER and not emulated:
            check_older(arch, t, vocab, model, facts, tmp)
        if arch in HYBRID and t == "F16" and not emulated:
            check_pattern(arch, vocab, model, facts[t]["prompts"][0], tmp)
        if arch == "gpt-oss" and t == "F16" and not emulated:
            check_bad_sink(vocab, facts[t]["prompts"][0], tmp)
        os.unlink(model)


def main(archs):
    with tempfile.TemporaryDirectory(prefix="lamina_arch_") as tmp:
        for a in archs:
            check_arch(a, tmp)
    if os.environ.get("LAMINA_ASAN"):
        print("NOTE under AddressSanitizer only the file and logits checks run, F16 only")
    elif os.environ.get("LAMINA_EMULATED"):
        print("NOTE under emulation only the file, logits and first greedy checks run, F16 only")
    return summary()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["qwen3", "gemma2", "phi3"]))
