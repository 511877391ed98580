#!/usr/bin/env python3
"""Generate tests/data/quant_golden.h: golden vectors for tests/test_quant.c.

The expected values come from an implementation independent of lamina: the
`gguf` Python package's numpy (de)quantizers (gguf.quants), which follow the
GGUF reference formats, and numpy's own float16 conversion. Run from the
repository root with `gguf` and `numpy` installed (a virtual environment is
enough); lamina's build and tests never need Python.

  python3 tests/data/gen_quant_golden.py > tests/data/quant_golden.h

Contents:
  * dequantization: blocks of every computed type (random bytes with
    hand-chosen f16 scales, plus blocks produced by the reference quantizers)
    and the floats gguf.quants.dequantize returns for them, as IEEE bit
    patterns, to be matched bit for bit;
  * quantization: float inputs and the Q8_0 / Q4_0 / BF16 bytes that
    gguf.quants.quantize produces, and the F16 bits numpy produces;
  * Q8_K (not in gguf.quants): x = d * q evaluated in numpy float32;
  * the type table: id, name, block size and bytes per block of every type.
"""
from importlib.metadata import version

import numpy as np
import gguf
from gguf.quants import dequantize, quantize
from gguf.constants import GGMLQuantizationType as T

rng = np.random.default_rng(20240611)


def f16_bytes(v):
    return np.array([v], dtype=np.float16).view(np.uint8)


def random_blocks(qtype, nblocks, fields):
    """Random bytes per block; `fields` maps byte offset -> f16 value per block."""
    size = gguf.GGML_QUANT_SIZES[qtype][1]
    raw = rng.integers(0, 256, size=(nblocks, size), dtype=np.uint8)
    for off, vals in fields.items():
        for b, v in enumerate(vals):
            raw[b, off:off + 2] = f16_bytes(v)
    return raw


def c_bytes(name, arr):
    arr = np.ascontiguousarray(arr, dtype=np.uint8).ravel()
    body = ",".join(("\n    " if i % 16 == 0 else " ") + "0x%02x" % x for i, x in enumerate(arr))
    return "static const uint8_t %s[%d] = {%s\n};\n" % (name, arr.size, body)


def c_words(name, arr, ctype="uint32_t", width=8, fmt="0x%08x"):
    arr = np.ascontiguousarray(arr).ravel()
    body = ",".join(("\n    " if i % width == 0 else " ") + fmt % x for i, x in enumerate(arr))
    return "static const %s %s[%d] = {%s\n};\n" % (ctype, name, arr.size, body)


def f32_bits(a):
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


out = []
deq_cases = []
q_cases = []

# --- K-quants: 3 blocks each of random bytes; d (and dmin) chosen so that
# block 0 is ordinary, block 1 has a negative d and a large dmin, block 2 a
# subnormal d and a zero dmin.
kq = [
    ("q4_K", T.Q4_K, {0: [0.0123, -0.5, 2.0 ** -20], 2: [0.0071, 1.75, 0.0]}),
    ("q5_K", T.Q5_K, {0: [0.0061, -0.25, 3 * 2.0 ** -24], 2: [0.0133, 3.5, 0.0]}),
    ("q6_K", T.Q6_K, {208: [0.0042, -1.5, 2.0 ** -18]}),
]
for name, qt, fields in kq:
    blocks = random_blocks(qt, 3, fields)
    y = dequantize(blocks, qt)
    out.append(c_bytes("golden_%s_blocks" % name, blocks))
    out.append(c_words("golden_%s_floats" % name, f32_bits(y)))
    deq_cases.append(("LM_TYPE_%s" % name.upper(), 3 * 256, name))

# --- Q8_0 / Q4_0: inputs (Gaussian, one large-magnitude block, one constant
# block, one zero block, one block with an outlier) quantized by gguf, then
# dequantized by gguf; plus random-byte blocks with chosen scales.
x = rng.standard_normal((5, 32)).astype(np.float32)
x[1] *= 1000.0
x[2] = 0.37
x[3] = 0.0
x[4, 7] = -40.0
for name, qt, rnd_fields in [("q8_0", T.Q8_0, {0: [0.02, -3.0, 2.0 ** -22]}),
                             ("q4_0", T.Q4_0, {0: [0.125, -7.5, 2.0 ** -23]})]:
    qb = quantize(x.reshape(-1), qt).reshape(5, -1)
    out.append(c_words("golden_%s_input" % name, f32_bits(x)))
    out.append(c_bytes("golden_%s_quant" % name, qb))
    q_cases.append(("LM_TYPE_%s" % name.upper(), 5 * 32, name))
    blocks = np.concatenate([qb, random_blocks(qt, 3, rnd_fields)])
    y = dequantize(blocks, qt)
    out.append(c_bytes("golden_%s_blocks" % name, blocks))
    out.append(c_words("golden_%s_floats" % name, f32_bits(y)))
    deq_cases.append(("LM_TYPE_%s" % name.upper(), 8 * 32, name))

# --- Q8_K: {f32 d; int8 qs[256]; int16 bsums[16]}, x = d * q in float32.
q8k = []
q8k_y = []
for d in [0.0123, -7.25e-4]:
    qs = rng.integers(-128, 128, size=256, dtype=np.int8)
    bs = qs.astype(np.int16).reshape(16, 16).sum(axis=1).astype(np.int16)
    q8k.append(np.concatenate([np.array([d], np.float32).view(np.uint8),
                               qs.view(np.uint8), bs.view(np.uint8)]))
    q8k_y.append(np.float32(d) * qs.astype(np.float32))
out.append(c_bytes("golden_q8_K_blocks", np.stack(q8k)))
out.append(c_words("golden_q8_K_floats", f32_bits(np.concatenate(q8k_y))))
deq_cases.append(("LM_TYPE_Q8_K", 2 * 256, "q8_K"))

# --- F16 / BF16 rounding of awkward floats: ties at several exponents,
# subnormals, values near the overflow threshold, infinities, NaN, and
# random bit patterns.
special = [0.0, -0.0, 1.0, 1.0 + 2 ** -11, 1.0 + 3 * 2 ** -11, 1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8,
           65504.0, 65519.0, 65520.0, 65536.0, 1e10, -1e10, 2 ** -24, 2 ** -25, 3 * 2 ** -25,
           2 ** -26, 2 ** -14 - 2 ** -25, 1e-8, -1e-8, 3.0e38, float("inf"), float("-inf"),
           float("nan"), 1.0 / 3.0, -2.0 / 3.0, 0.1, 1e-40, -1e-44, 3.4028235e38]
bits = rng.integers(0, 2 ** 32, size=226, dtype=np.uint64).astype(np.uint32)
vals = np.concatenate([np.array(special, dtype=np.float32), bits.view(np.float32)])
with np.errstate(over="ignore", invalid="ignore"):
    h16 = vals.astype(np.float16).view(np.uint16)
b16 = quantize(vals, T.BF16).view(np.uint16)
out.append(c_words("golden_half_input", vals.view(np.uint32)))
out.append(c_words("golden_f16_bits", h16, "uint16_t", 12, "0x%04x"))
out.append(c_words("golden_bf16_bits", b16, "uint16_t", 12, "0x%04x"))

print("/*")
print(" * quant_golden.h - golden vectors for tests/test_quant.c. Generated by")
print(" * tests/data/gen_quant_golden.py; do not edit.")
print(" *")
print(" * Expected values come from the `gguf` Python package's reference")
print(" * (de)quantizers (gguf.quants, gguf %s) and numpy %s float16" % (version("gguf"), np.__version__))
print(" * conversion; Q8_K floats are d * q evaluated in numpy float32. Floats are")
print(" * stored as IEEE-754 bit patterns so the comparison is bit for bit.")
print(" */")
print("#ifndef LAMINA_QUANT_GOLDEN_H")
print("#define LAMINA_QUANT_GOLDEN_H")
print()
print("#include <stddef.h>")
print("#include <stdint.h>")
print()
print("\n".join(out))
print("typedef struct {")
print("    uint32_t type;")
print("    int64_t n;              /* elements */")
print("    const uint8_t *blocks;  /* quant_row_size(type, n) bytes */")
print("    const uint32_t *floats; /* n expected outputs of to_float */")
print("} golden_dequant;")
print()
print("static const golden_dequant golden_dequant_cases[] = {")
for t, n, name in deq_cases:
    print("    {%s, %d, golden_%s_blocks, golden_%s_floats}," % (t, n, name, name))
print("};")
print()
print("typedef struct {")
print("    uint32_t type;")
print("    int64_t n;              /* elements */")
print("    const uint32_t *input;  /* n floats */")
print("    const uint8_t *blocks;  /* expected from_float output */")
print("} golden_quant;")
print()
print("static const golden_quant golden_quant_cases[] = {")
for t, n, name in q_cases:
    print("    {%s, %d, golden_%s_input, golden_%s_quant}," % (t, n, name, name))
print("};")
print()
print("/* Every type id the gguf package knows, with its block size and bytes per")
print(" * block (gguf.constants.GGML_QUANT_SIZES). */")
print("typedef struct {")
print("    uint32_t id;")
print("    const char *name;")
print("    int64_t blck;")
print("    size_t type_size;")
print("} golden_type;")
print()
print("static const golden_type golden_types[] = {")
for t in T:
    if t in gguf.GGML_QUANT_SIZES:
        blck, size = gguf.GGML_QUANT_SIZES[t]
        print('    {%d, "%s", %d, %d},' % (int(t), t.name, blck, size))
print("};")
print()
print("#endif")
