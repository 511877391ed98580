#!/usr/bin/env python3
"""The files lamina mkmodel writes for the hybrid presets qwen35-small,
qwen35moe-small (Qwen3.5's gated-DeltaNet and gated-attention layers) and
qwen3next-small (Qwen3-Next's: no RoPE sections, beta and alpha in one
ssm_ba of 2 H_v rows), read back with a GGUF reader of its own (standard
library only):
  - the bytes: the same file from -t 1 and -t 3, another from another seed,
    and the sha256 recorded in SHA256 for F16 and Q8_0 with the gpt-2
    vocabulary (the files llama.cpp's qwen35, qwen35moe and qwen3next
    loaders were run on: tests/data/arch_README.md);
  - the keys llama.cpp's loaders read, each with its type and value;
  - every tensor's name, shape (ne, fastest first) and type, and no other
    tensor (llama.cpp refuses a file with tensors it does not read): layer i
    is full attention iff (i + 1) % 4 == 0; matrices are of the weight type
    (Q4_K falls back to Q8_0 for rows not a multiple of 256), norms, conv
    kernels, routers and per-head vectors F32;
  - the values of the F32 vectors: ssm_a = -A with A in [1, 16],
    softplus(ssm_dt.bias) in [0.001, 0.1], norms 1 plus noise of 0.1, conv
    taps of standard deviation 1/2;
  - qwen3next --ssm-in (an older conversion's layout): each recurrent
    layer's ssm_in (E, 2 KD + 2 VD) in place of attn_qkv and attn_gate, its
    rows those two tensors' rows of the default file, byte for byte, in the
    order per key head [q | k | its values | their z]; every other tensor
    the same bytes.
"""
import hashlib
import math
import os
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from testenv import result, summary  # noqa: E402 (tests/ is the script's folder)

HERE = os.path.dirname(os.path.abspath(__file__))
LAMINA = os.environ.get("LAMINA_BIN", "build/lamina")
VOCAB = os.path.join(HERE, "data", "vocab", "ggml-vocab-gpt-2.gguf")
N_VOCAB = 50257

# GGUF tensor types: (id, elements per block, bytes per block)
TYPES = {"F32": (0, 1, 4), "F16": (1, 1, 2), "Q8_0": (8, 32, 34), "Q4_K": (12, 256, 144)}
TYPE_NAME = {v[0]: k for k, v in TYPES.items()}

SHA256 = {
    ("qwen35-small", "F16"): "ac5e719e519ff34e2e84829b66042b9e6623bccd1af7899f0a3365c10cfab0a9",
    ("qwen35-small", "Q8_0"): "5c3531575cf76f7e73ce100bcce25e21f95f7bc51248e8ee2141c97a51ba1ee3",
    ("qwen35moe-small", "F16"): "bfdba4bfb5acee6a600f366655d2dcc3ed1577f9782b433053a003ecd312f004",
    ("qwen35moe-small", "Q8_0"): "60f058c70cc13691c937341b12296b82b296e9712fa72cfd4a9df833e2d6ed99",
    ("qwen3next-small", "F16"): "05a58df9c3b081d1da0c52afb895997950f9344e48635591716e9d0fb6968d4a",
    ("qwen3next-small", "Q8_0"): "5236207fdeb5f2432a9746daf75a96d04a011773aabd12a026b7f2e3fba1bf68",
}

# The presets' shapes: layers, n_embd, n_ff, heads, KV heads, head width, rotated dims,
# key heads H_k, value heads H_v, their width, conv taps, experts, used, expert width, shared width;
# qwen3next: no rope.dimension_sections, a fused ssm_ba
SHAPE = {
    "qwen35-small": dict(L=8, E=256, FF=768, H=4, KV=2, HD=128, ROT=32,
                         HK=2, HV=4, D=64, K=4, X=0, XU=0, FE=0, FS=0, arch="qwen35"),
    "qwen35moe-small": dict(L=8, E=256, FF=128, H=4, KV=2, HD=128, ROT=32,
                            HK=2, HV=4, D=128, K=4, X=8, XU=2, FE=128, FS=128, arch="qwen35moe"),
    "qwen3next-small": dict(L=8, E=256, FF=128, H=4, KV=2, HD=128, ROT=32,
                            HK=2, HV=4, D=128, K=4, X=8, XU=2, FE=128, FS=128, arch="qwen3next"),
}


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


class Gguf:
    """keys: {name: (value type, value)}; tensors: {name: (ne tuple, type id, absolute offset)}."""
    SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}

    def __init__(self, path):
        with open(path, "rb") as f:
            self.buf = f.read()
        self.pos = 0
        if self.take(4) != b"GGUF" or self.u32() != 3:
            raise ValueError("not a GGUF v3 file")
        n_t, n_kv = self.u64(), self.u64()
        self.keys = {}
        for _ in range(n_kv):
            k = self.text()
            t = self.u32()
            self.keys[k] = (t, self.value(t))
        infos = []
        for _ in range(n_t):
            name = self.text()
            nd = self.u32()
            ne = tuple(self.u64() for _ in range(nd))
            infos.append((name, ne, self.u32(), self.u64()))
        align = self.keys.get("general.alignment", (4, 32))[1]
        base = (self.pos + align - 1) // align * align
        self.tensors = {n: (ne, t, base + off) for n, ne, t, off in infos}

    def take(self, n):
        b = self.buf[self.pos:self.pos + n]
        self.pos += n
        return b

    def u32(self):
        return struct.unpack("<I", self.take(4))[0]

    def u64(self):
        return struct.unpack("<Q", self.take(8))[0]

    def text(self):
        return self.take(self.u64()).decode("utf-8", "replace")

    def value(self, t):
        if t == 8:
            return self.text()
        if t == 9:
            et, n = self.u32(), self.u64()
            return (et, [self.value(et) for _ in range(n)])
        fmt = self.SCALAR[t]
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def f32(self, name):
        ne, t, off = self.tensors[name]
        n = math.prod(ne)
        return struct.unpack("<%df" % n, self.buf[off:off + 4 * n])


def expected_keys(s):
    a = s["arch"]
    u32, f32 = 4, 6
    k = {
        "general.architecture": (8, a),
        a + ".block_count": (u32, s["L"]),
        a + ".context_length": (u32, 4096),
        a + ".embedding_length": (u32, s["E"]),
        a + ".feed_forward_length": (u32, s["FF"]),
        a + ".attention.head_count": (u32, s["H"]),
        a + ".attention.head_count_kv": (u32, s["KV"]),
        a + ".attention.key_length": (u32, s["HD"]),
        a + ".attention.value_length": (u32, s["HD"]),
        a + ".attention.layer_norm_rms_epsilon": (f32, struct.unpack("<f", struct.pack("<f", 1e-6))[0]),
        a + ".rope.dimension_count": (u32, s["ROT"]),
        a + ".rope.freq_base": (f32, 1e7),
        a + ".ssm.conv_kernel": (u32, s["K"]),
        a + ".ssm.inner_size": (u32, s["HV"] * s["D"]),
        a + ".ssm.state_size": (u32, s["D"]),
        a + ".ssm.time_step_rank": (u32, s["HV"]),
        a + ".ssm.group_count": (u32, s["HK"]),
        a + ".full_attention_interval": (u32, 4),
        a + ".vocab_size": (u32, N_VOCAB),
    }
    if a != "qwen3next":  # Qwen3-Next's RoPE is plain NeoX
        k[a + ".rope.dimension_sections"] = (9, (5, [6, 5, 5, 0]))
    if s["X"]:
        k[a + ".expert_count"] = (u32, s["X"])
        k[a + ".expert_used_count"] = (u32, s["XU"])
        k[a + ".expert_feed_forward_length"] = (u32, s["FE"])
        k[a + ".expert_shared_feed_forward_length"] = (u32, s["FS"])
    return k


def expected_tensors(s, t):
    """{name: (ne, type name)}: t for matrices (Q4_K rows not a multiple of 256 as Q8_0), F32 otherwise."""
    def m(cols):
        return "Q8_0" if t == "Q4_K" and cols % 256 else t
    E, HD = s["E"], s["HD"]
    Q, KVD = s["H"] * HD, s["KV"] * HD
    KD, VD = s["HK"] * s["D"], s["HV"] * s["D"]
    C = 2 * KD + VD
    x = {"token_embd.weight": ((E, N_VOCAB), t), "output_norm.weight": ((E,), "F32"),
         "output.weight": ((E, N_VOCAB), t)}
    for i in range(s["L"]):
        b = "blk.%d." % i
        x[b + "attn_norm.weight"] = ((E,), "F32")
        x[b + "post_attention_norm.weight"] = ((E,), "F32")
        if (i + 1) % 4:
            x[b + "attn_qkv.weight"] = ((E, C), m(E))
            x[b + "attn_gate.weight"] = ((E, VD), m(E))
            x[b + "ssm_conv1d.weight"] = ((s["K"], C), "F32")
            x[b + "ssm_dt.bias"] = ((s["HV"],), "F32")
            x[b + "ssm_a"] = ((s["HV"],), "F32")
            if s["arch"] == "qwen3next":
                x[b + "ssm_ba.weight"] = ((E, 2 * s["HV"]), m(E))
            else:
                x[b + "ssm_beta.weight"] = ((E, s["HV"]), m(E))
                x[b + "ssm_alpha.weight"] = ((E, s["HV"]), m(E))
            x[b + "ssm_norm.weight"] = ((s["D"],), "F32")
            x[b + "ssm_out.weight"] = ((VD, E), m(VD))
        else:
            x[b + "attn_q.weight"] = ((E, 2 * Q), m(E))
            x[b + "attn_k.weight"] = ((E, KVD), m(E))
            x[b + "attn_v.weight"] = ((E, KVD), m(E))
            x[b + "attn_q_norm.weight"] = ((HD,), "F32")
            x[b + "attn_k_norm.weight"] = ((HD,), "F32")
            x[b + "attn_output.weight"] = ((Q, E), m(Q))
        if s["X"]:
            X, FE, FS = s["X"], s["FE"], s["FS"]
            x[b + "ffn_gate_inp.weight"] = ((E, X), "F32")
            x[b + "ffn_gate_exps.weight"] = ((E, FE, X), m(E))
            x[b + "ffn_up_exps.weight"] = ((E, FE, X), m(E))
            x[b + "ffn_down_exps.weight"] = ((FE, E, X), m(FE))
            x[b + "ffn_gate_inp_shexp.weight"] = ((E,), "F32")
            x[b + "ffn_gate_shexp.weight"] = ((E, FS), m(E))
            x[b + "ffn_up_shexp.weight"] = ((E, FS), m(E))
            x[b + "ffn_down_shexp.weight"] = ((FS, E), m(FS))
        else:
            x[b + "ffn_gate.weight"] = ((E, s["FF"]), m(E))
            x[b + "ffn_up.weight"] = ((E, s["FF"]), m(E))
            x[b + "ffn_down.weight"] = ((s["FF"], E), m(s["FF"]))
    return x


def mkmodel(preset, t, out, *extra):
    return subprocess.run([LAMINA, "mkmodel", "--preset", preset, "--type", t, "--vocab-from", VOCAB,
                           "-o", out, *extra], capture_output=True, timeout=300)


def check_file(preset, t, path):
    s = SHAPE[preset]
    g = Gguf(path)
    bad = []
    for k, (vt, v) in expected_keys(s).items():
        got = g.keys.get(k)
        if got is None or got[0] != vt or (got[1] != v if vt != 6 else abs(got[1] - v) > 1e-6 * abs(v)):
            bad.append("%s: %r, want %r" % (k, got, (vt, v)))
    extra = [k for k in g.keys if k.startswith(s["arch"] + ".") and k not in expected_keys(s)]
    result("%s %s keys" % (preset, t), not bad and not extra, "; ".join(bad) + " extra: %s" % extra)

    want = expected_tensors(s, t)
    bad = []
    for n, (ne, tn) in want.items():
        got = g.tensors.get(n)
        if got is None or got[0] != ne or got[1] != TYPES[tn][0]:
            bad.append("%s: %s, want %s %s" % (n, got and (got[0], TYPE_NAME.get(got[1], got[1])), ne, tn))
    extra = sorted(set(g.tensors) - set(want))
    result("%s %s tensors: %d, names, shapes and types" % (preset, t, len(want)), not bad and not extra,
           "; ".join(bad[:20]) + " extra: %s" % extra[:20])
    if bad or extra:
        return

    a, dt, norms, conv = [], [], [], []
    for i in range(s["L"]):
        b = "blk.%d." % i
        norms += g.f32(b + "attn_norm.weight") + g.f32(b + "post_attention_norm.weight")
        if (i + 1) % 4:
            a += g.f32(b + "ssm_a")
            dt += g.f32(b + "ssm_dt.bias")
            norms += g.f32(b + "ssm_norm.weight")
            conv += g.f32(b + "ssm_conv1d.weight")
        else:
            norms += g.f32(b + "attn_q_norm.weight") + g.f32(b + "attn_k_norm.weight")
    sp = [math.log1p(math.exp(v)) for v in dt]
    mean = sum(norms) / len(norms)
    sd = math.sqrt(sum((v - mean) ** 2 for v in norms) / len(norms))
    csd = math.sqrt(sum(v * v for v in conv) / len(conv))
    ok = (all(-16 <= v <= -1 for v in a) and max(a) - min(a) > 5 and
          all(0.001 * 0.999 <= v <= 0.1 * 1.001 for v in sp) and max(sp) / min(sp) > 5 and
          abs(mean - 1) < 0.02 and 0.08 < sd < 0.12 and 0.45 < csd < 0.55)
    result("%s %s values: ssm_a, softplus(ssm_dt.bias), norms, conv taps" % (preset, t), ok,
           "ssm_a [%g, %g], softplus(dt_bias) [%g, %g], norms %g +- %g, conv sd %g"
           % (min(a), max(a), min(sp), max(sp), mean, sd, csd))


def tensor_rows(g, name):
    ne, t, off = g.tensors[name]
    _, per, size = TYPES[TYPE_NAME[t]]
    rb = ne[0] // per * size
    return [g.buf[off + r * rb:off + (r + 1) * rb] for r in range(math.prod(ne[1:]))]


def check_ssm_in(preset, t, path, tmp):
    older = os.path.join(tmp, "older.gguf")
    r = mkmodel(preset, t, older, "--ssm-in")
    if not result("%s %s --ssm-in written" % (preset, t), r.returncode == 0, r.stderr.decode()):
        return
    s, a, b = SHAPE[preset], Gguf(path), Gguf(older)
    dk, hk, rv = s["D"], s["HK"], s["HV"] // s["HK"] * s["D"]
    bad = []
    for i in range(s["L"]):
        p = "blk.%d." % i
        if (i + 1) % 4 == 0:
            continue
        qkv, z = tensor_rows(a, p + "attn_qkv.weight"), tensor_rows(a, p + "attn_gate.weight")
        want = []
        for k in range(hk):
            want += qkv[k * dk:(k + 1) * dk] + qkv[(hk + k) * dk:(hk + k + 1) * dk]
            want += qkv[2 * hk * dk + k * rv:2 * hk * dk + (k + 1) * rv] + z[k * rv:(k + 1) * rv]
        ne = b.tensors.get(p + "ssm_in.weight", (None,))[0]
        if ne != (s["E"], len(want)) or tensor_rows(b, p + "ssm_in.weight") != want:
            bad.append("blk.%d ssm_in" % i)
    names_a = {n for n in a.tensors if not n.endswith(("attn_qkv.weight", "attn_gate.weight"))}
    names_b = {n for n in b.tensors if not n.endswith("ssm_in.weight")}
    if names_a != names_b:
        bad.append("tensor names differ: %s" % sorted(names_a ^ names_b)[:10])
    else:
        bad += [n for n in sorted(names_a) if tensor_rows(a, n) != tensor_rows(b, n)][:10]
    result("%s %s --ssm-in: ssm_in holds attn_qkv's and attn_gate's rows per key head, the rest the same"
           % (preset, t), not bad, "; ".join(bad))
    os.unlink(older)


def main():
    with tempfile.TemporaryDirectory(prefix="lamina_mkmodel_") as tmp:
        for preset in SHAPE:
            for t in ["F16", "Q8_0"] + (["Q4_K"] if preset == "qwen35-small" else []):
                path = os.path.join(tmp, "%s-%s.gguf" % (preset, t))
                r = mkmodel(preset, t, path, "-t", "1")
                if not result("%s %s written" % (preset, t), r.returncode == 0, r.stderr.decode()):
                    continue
                h = sha256(path)
                if (preset, t) in SHA256:
                    result("%s %s file is the recorded one" % (preset, t), h == SHA256[(preset, t)],
                           "sha256 %s, recorded %s" % (h, SHA256[(preset, t)]))
                check_file(preset, t, path)
                if SHAPE[preset]["arch"] == "qwen3next":
                    check_ssm_in(preset, t, path, tmp)
                if t == "Q8_0":
                    other = os.path.join(tmp, "other.gguf")
                    r = mkmodel(preset, t, other, "-t", "3")
                    result("%s %s: the same bytes from 3 threads" % (preset, t),
                           r.returncode == 0 and sha256(other) == h, r.stderr.decode())
                    r = mkmodel(preset, t, other, "-t", "3", "--seed", "2")
                    result("%s %s: other bytes from another seed" % (preset, t),
                           r.returncode == 0 and sha256(other) != h, r.stderr.decode())
                    os.unlink(other)
                os.unlink(path)
    return summary()


if __name__ == "__main__":
    sys.exit(main())
