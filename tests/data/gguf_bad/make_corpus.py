#!/usr/bin/env python3
"""Writes the corpus of malformed GGUF files that tests/test_gguf.c opens,
and the seed inputs of the GGUF fuzz target (fuzz/seeds/fuzz_gguf/).

Each bad file is a small valid GGUF (the control files `ok_*.gguf`) with one
defect. manifest.txt lists every file with a substring the reader's error
message must contain, or OK for a control file. The seeds are valid files
covering every value type, nested arrays and several tensor types.
Standard library only; run from anywhere:
    python3 tests/data/gguf_bad/make_corpus.py
"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
SEEDS = os.path.join(HERE, '..', '..', '..', 'fuzz', 'seeds', 'fuzz_gguf')

# value types
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
# ggml types used here: (id, block elements, block bytes)
T_F32, T_F16, T_Q8_0 = (0, 1, 4), (1, 1, 2), (8, 32, 34)
T_Q4_0, T_Q4_K, T_I8 = (2, 32, 18), (12, 256, 144), (24, 1, 1)


def u32(v): return struct.pack('<I', v & 0xffffffff)
def u64(v): return struct.pack('<Q', v & 0xffffffffffffffff)
def s(b):
    b = b.encode() if isinstance(b, str) else b
    return u64(len(b)) + b


def kv(key, vtype, raw):
    """One kv entry; raw is the serialized value."""
    return s(key) + u32(vtype) + raw


def arr(etype, elems, n=None):
    """Array value: element type, count, concatenated serialized elements."""
    return u32(etype) + u64(len(elems) if n is None else n) + b''.join(elems)


def tinfo(name, ne, ttype, offset):
    return s(name) + u32(len(ne)) + b''.join(u64(d) for d in ne) + u32(ttype) + u64(offset)


def nbytes(ttype, ne):
    _, blk, size = ttype
    n = size * (ne[0] // blk)
    for d in ne[1:]:
        n *= d
    return n


def base_kvs():
    return [
        kv('general.architecture', STR, s('tiny')),
        kv('general.alignment', U32, u32(32)),
        kv('tokenizer.ggml.tokens', ARR, arr(STR, [s('<unk>'), s('a'), s('bc')])),
        kv('tiny.block_count', U32, u32(2)),
    ]


def base_tensors():
    """(name, ne, type) for the control file."""
    return [('a', [8], T_F32), ('b', [32, 2], T_Q8_0), ('c', [3, 1, 2], T_F16)]


def build(version=3, kvs=None, tensors=None, infos=None, n_kv=None, n_t=None,
          align=32, data=None, cut=None, magic=b'GGUF', pad_head=True):
    """A GGUF file. tensors: (name, ne, type) laid out at the alignment;
    infos overrides the serialized tensor directory entirely."""
    kvs = base_kvs() if kvs is None else kvs
    tensors = base_tensors() if tensors is None else tensors
    if infos is None:
        infos, off, blob = [], 0, b''
        for name, ne, tt in tensors:
            infos.append(tinfo(name, ne, tt[0], off))
            nb = nbytes(tt, ne)
            blob += bytes((i * 7 + 1) & 0xff for i in range(nb))
            off += nb
            pad = (-off) % align
            blob += b'\0' * pad
            off += pad
        data = blob if data is None else data
    head = (magic + u32(version) + u64(len(infos) if n_t is None else n_t)
            + u64(len(kvs) if n_kv is None else n_kv) + b''.join(kvs) + b''.join(infos))
    if pad_head:
        head += b'\0' * ((-len(head)) % align)
    out = head + (data or b'')
    return out if cut is None else out[:cut]


def with_kv(*extra, drop=None):
    kvs = [k for k in base_kvs() if drop is None or drop not in k[:60]]
    return kvs + list(extra)


def nested(depth, leaf=None):
    """An array value nested depth levels (depth 1 = a plain array)."""
    val = arr(U8, [b'\x01']) if leaf is None else leaf
    for _ in range(depth - 1):
        val = arr(ARR, [val])
    return val


def files():
    f = {}
    ok = build()
    f['ok_v3.gguf'] = (ok, 'OK')
    f['ok_v2.gguf'] = (build(version=2), 'OK')
    f['ok_nested8.gguf'] = (build(kvs=with_kv(kv('deep', ARR, nested(8)))), 'OK')
    f['ok_no_tensors.gguf'] = (build(tensors=[]), 'OK')

    # header
    f['bad_magic.gguf'] = (build(magic=b'GGUX'), 'not a GGUF file')
    f['short_magic.gguf'] = (b'GG', 'not a GGUF file')
    f['version_1.gguf'] = (build(version=1), 'version 1 is not supported')
    f['version_4.gguf'] = (build(version=4), 'version 4 is not supported')
    f['version_big_endian.gguf'] = (build(version=0x03000000), 'big-endian')
    f['trunc_version.gguf'] = (ok[:6], 'header version')
    f['trunc_tensor_count.gguf'] = (ok[:12], 'header tensor count')
    f['trunc_kv_count.gguf'] = (ok[:20], 'header kv count')
    f['huge_kv_count.gguf'] = (build(n_kv=1 << 62), 'kv count 4611686018427387904 cannot fit')
    f['kv_count_too_big.gguf'] = (build(n_kv=5000), 'kv count 5000 cannot fit')
    f['huge_tensor_count.gguf'] = (build(n_t=(1 << 64) - 1), 'tensor count 18446744073709551615 cannot fit')

    # kv section: truncations (the file is cut inside the named part)
    one = lambda entry, **kw: build(kvs=[entry], tensors=[], **kw)
    k = kv('a.fairly.long.key.name', U32, u32(7))
    f['trunc_in_key.gguf'] = (one(k, cut=24 + 8 + 10) + b'\0' * 4, 'key length 22')
    f['trunc_in_value_type.gguf'] = (one(kv('key.x', U32, u32(1)), cut=24 + 8 + 5 + 2), 'value type at offset')
    f['trunc_in_scalar.gguf'] = (one(kv('k', U64, u64(1)), cut=24 + 14), 'uint64 at offset 37 needs 8')
    f['trunc_in_string.gguf'] = (one(kv('k', STR, s('x' * 100)), cut=24 + 13 + 8 + 40), 'string length 100')
    f['trunc_in_array.gguf'] = (one(kv('k', ARR, arr(U32, [u32(i) for i in range(10)])), cut=24 + 13 + 12 + 20),
                                'array of 10 uint32')
    f['trunc_in_array_count.gguf'] = (one(kv('k', ARR, arr(U32, [u32(1)])), cut=24 + 13 + 4 + 3), 'array count at')
    f['trunc_in_array_string.gguf'] = (one(kv('k', ARR, arr(STR, [s('one'), s('two'), s('three' * 9)])),
                                           cut=24 + 13 + 12 + 11 + 11 + 8 + 10), 'element 2: array string length 45')
    f['trunc_in_nested.gguf'] = (one(kv('k', ARR, nested(3, arr(I64, [u64(1), u64(2)]))), cut=24 + 13 + 36 + 10),
                                 'array of 2 int64')

    # kv section: hostile values
    f['huge_key_len.gguf'] = (build(kvs=[s('k')[:0] + u64(1 << 63) + b'k' * 20] + base_kvs()[1:]),
                              'key length 9223372036854775808')
    f['huge_string_len.gguf'] = (build(kvs=with_kv(kv('k', STR, u64((1 << 64) - 1) + b'abc'))),
                                 'string length 18446744073709551615')
    f['huge_array_count.gguf'] = (build(kvs=with_kv(kv('k', ARR, u32(U32) + u64(1 << 62) + u32(5)))),
                                  'array of 4611686018427387904 uint32')
    f['huge_array_count_str.gguf'] = (build(kvs=with_kv(kv('k', ARR, u32(STR) + u64(1 << 40) + s('x')))),
                                      'array count 1099511627776 of string')
    f['huge_array_count_arr.gguf'] = (build(kvs=with_kv(kv('k', ARR, u32(ARR) + u64((1 << 64) - 1)))),
                                      'array count 18446744073709551615 of array')
    f['nested_too_deep.gguf'] = (build(kvs=with_kv(kv('deep', ARR, nested(9)))), 'nested deeper than 8')
    f['nested_bomb.gguf'] = (build(kvs=with_kv(kv('deep', ARR, nested(40)))), 'nested deeper than 8')
    f['bad_value_type.gguf'] = (build(kvs=with_kv(kv('k', 13, u32(0)))), 'unknown value type 13')
    f['bad_value_type_huge.gguf'] = (build(kvs=with_kv(kv('k', 0xffffffff, u32(0)))), 'unknown value type 4294967295')
    f['bad_array_type.gguf'] = (build(kvs=with_kv(kv('k', ARR, u32(77) + u64(1) + u32(0)))),
                                'unknown array element type 77')
    f['bad_bool.gguf'] = (build(kvs=with_kv(kv('flag', BOOL, b'\x02'))), 'bool value 2 is not 0 or 1')
    f['bad_bool_in_array.gguf'] = (build(kvs=with_kv(kv('flags', ARR, arr(BOOL, [b'\x00', b'\xff'])))),
                                   'element 1: bool value 255')
    f['empty_key.gguf'] = (build(kvs=with_kv(kv('', U32, u32(1)))), 'empty key')
    f['key_with_nul.gguf'] = (build(kvs=with_kv(kv('a\0b', U32, u32(1)))), 'key contains a NUL byte')
    f['key_too_long.gguf'] = (build(kvs=with_kv(kv('k' * 70000, U32, u32(1)))), 'key of 70000 bytes')
    f['duplicate_key.gguf'] = (build(kvs=with_kv(kv('tiny.block_count', U32, u32(3)))),
                               "kv 4 'tiny.block_count': duplicate key")
    f['alignment_0.gguf'] = (build(kvs=with_kv(kv('general.alignment', U32, u32(0)), drop=b'general.alignment')),
                             'general.alignment 0 is not')
    f['alignment_3.gguf'] = (build(kvs=with_kv(kv('general.alignment', U32, u32(3)), drop=b'general.alignment')),
                             'general.alignment 3 is not')
    f['alignment_u64.gguf'] = (build(kvs=with_kv(kv('general.alignment', U64, u64(32)), drop=b'general.alignment')),
                               'general.alignment has type uint64')

    # tensor directory
    def t(infos, data=b'\0' * 256, **kw):
        return build(infos=infos, data=data, **kw)
    a8 = lambda off=0: tinfo('a', [8], 0, off)
    f['bad_tensor_type.gguf'] = (t([a8(), tinfo('q', [32], 4, 32)]), "tensor 'q': unknown ggml type 4")
    f['bad_tensor_type_huge.gguf'] = (t([tinfo('q', [32], 1000, 0)]), 'unknown ggml type 1000')
    f['ndims_0.gguf'] = (t([tinfo('z', [], 0, 0)]), "tensor 'z': n_dims 0 is outside 1..4")
    f['ndims_5.gguf'] = (t([tinfo('z', [1, 1, 1, 1, 1], 0, 0)]), 'n_dims 5 is outside')
    f['ndims_huge.gguf'] = (t([s('z') + u32(0x80000000) + u64(1) + u32(0) + u64(0)]), 'n_dims 2147483648')
    f['dim_zero.gguf'] = (t([tinfo('z', [4, 0], 0, 0)]), 'dimension 1 is 0')
    f['dims_overflow.gguf'] = (t([tinfo('z', [1 << 32, 1 << 32, 4], 0, 0)]), 'element count overflows at dimension 1')
    f['dims_over_int64.gguf'] = (t([tinfo('z', [1 << 62, 2], 0, 0)]), 'element count overflows')
    f['bytes_overflow.gguf'] = (t([tinfo('z', [1 << 62], 0, 0)]), 'byte size overflows')
    f['ne0_not_block.gguf'] = (t([tinfo('q', [33, 2], 8, 0)]), 'ne[0] = 33 is not a multiple of the Q8_0 block size 32')
    f['misaligned_offset.gguf'] = (t([a8(), tinfo('b', [8], 0, 36)]), "tensor 'b': data offset 36 is not a multiple")
    f['misaligned_offset_a64.gguf'] = (
        t([tinfo('b', [8], 0, 32)], kvs=with_kv(kv('general.alignment', U32, u32(64)), drop=b'general.alignment'),
          align=64), 'not a multiple of the alignment 64')
    f['offset_past_end.gguf'] = (t([a8(), tinfo('b', [8], 0, 1 << 40)]),
                                 "tensor 'b': data [offset 1099511627776, +32 bytes] extends past end of file")
    f['offset_wraps.gguf'] = (t([tinfo('b', [8], 0, (1 << 64) - 32)]), 'extends past end of file')
    f['extent_past_end.gguf'] = (t([a8(), tinfo('big', [64, 2], 0, 32)]),
                                 "tensor 'big': data [offset 32, +512 bytes] extends past end of file")
    f['data_cut.gguf'] = (build(cut=len(ok) - 40), "tensor 'c': data")
    nopad = build(data=b'', kvs=with_kv(kv('pad', U8, b'\x01')), pad_head=False)
    assert len(nopad) % 32 != 0
    f['data_section_missing.gguf'] = (nopad, 'data section starts at')
    f['overlap.gguf'] = (t([a8(0), tinfo('b', [16], 0, 0)]), 'data overlap')
    f['overlap_partial.gguf'] = (t([tinfo('b', [16], 0, 32), tinfo('a', [16], 0, 64)]), 'data overlap')
    f['duplicate_tensor.gguf'] = (t([a8(0), a8(32)]), "tensor 'a': duplicate tensor name")
    f['empty_tensor_name.gguf'] = (t([tinfo('', [8], 0, 0)]), 'tensor 0: empty name')
    f['tensor_name_nul.gguf'] = (t([tinfo('a\0b', [8], 0, 0)]), 'name contains a NUL byte')
    f['tensor_name_long.gguf'] = (t([tinfo('n' * 257, [8], 0, 0)]), 'name of 257 bytes')
    f['trunc_in_tensor_info.gguf'] = (build(tensors=[('w', [8, 4], T_F32)], data=b'', align=1,
                                            cut=24 + sum(len(x) for x in base_kvs()) + 9 + 4 + 12),
                                      "tensor 'w': dimension at offset")
    f['trunc_in_tensor_name.gguf'] = (build(tensors=[('weights.long.name', [8], T_F32)], data=b'', align=1,
                                            cut=24 + sum(len(x) for x in base_kvs()) + 8 + 9),
                                      'tensor 0: name length 17')
    return f


def seeds(f):
    """Valid inputs for the fuzzer: the controls plus one with every type."""
    out = {k: v[0] for k, v in f.items() if v[1] == 'OK'}
    kvs = [
        kv('general.architecture', STR, s('seed')),
        kv('general.alignment', U32, u32(64)),
        kv('v.u8', U8, b'\xff'), kv('v.i8', I8, b'\x80'),
        kv('v.u16', U16, struct.pack('<H', 65535)), kv('v.i16', I16, struct.pack('<h', -2)),
        kv('v.u32', U32, u32(123)), kv('v.i32', I32, u32(-5)),
        kv('v.f32', F32, struct.pack('<f', 0.5)), kv('v.bool', BOOL, b'\x01'),
        kv('v.str', STR, s('hello')), kv('v.u64', U64, u64(1 << 63)),
        kv('v.i64', I64, u64(-9)), kv('v.f64', F64, struct.pack('<d', -2.5)),
        kv('a.u8', ARR, arr(U8, [b'\x01', b'\x02'])), kv('a.i16', ARR, arr(I16, [struct.pack('<h', -3)])),
        kv('a.f32', ARR, arr(F32, [struct.pack('<f', 1.0), struct.pack('<f', 2.0)])),
        kv('a.bool', ARR, arr(BOOL, [b'\x00', b'\x01'])),
        kv('a.i64', ARR, arr(I64, [u64(-1)])), kv('a.f64', ARR, arr(F64, [struct.pack('<d', 3.25)])),
        kv('a.str', ARR, arr(STR, [s('x'), s(''), s('yz')])),
        kv('a.empty', ARR, arr(U32, [])),
        kv('a.nested', ARR, arr(ARR, [arr(STR, [s('p'), s('q')]), arr(U16, []), nested(3)])),
    ]
    tensors = [('f32', [4, 2], T_F32), ('f16', [6], T_F16), ('q8', [32], T_Q8_0),
               ('q4', [64, 1, 2], T_Q4_0), ('q4k', [256], T_Q4_K), ('i8', [1, 1, 1, 3], T_I8)]
    out['all_types.gguf'] = build(kvs=kvs, tensors=tensors, align=64)
    return out


def main():
    entries = files()
    os.makedirs(SEEDS, exist_ok=True)
    for name, data in seeds(entries).items():
        with open(os.path.join(SEEDS, name), 'wb') as fh:
            fh.write(data)
    for name in os.listdir(HERE):
        if name.endswith('.gguf'):
            os.remove(os.path.join(HERE, name))
    lines = ['# <file> <substring the error message must contain>, or OK: the file must open.',
             '# Generated by make_corpus.py; edit that script, not this file.']
    for name, (data, want) in sorted(entries.items()):
        with open(os.path.join(HERE, name), 'wb') as fh:
            fh.write(data)
        lines.append(f'{name} {want}')
    with open(os.path.join(HERE, 'manifest.txt'), 'w') as fh:
        fh.write('\n'.join(lines) + '\n')
    total = sum(len(d) for d, _ in entries.values())
    print(f'{len(entries)} files, {total} bytes')


if __name__ == '__main__':
    main()
