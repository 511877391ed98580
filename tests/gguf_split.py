#!/usr/bin/env python3
"""gguf_split.py - cut a GGUF file into N parts the way llama.cpp's
gguf-split does, for the tests (no dependencies):

  PREFIX-00001-of-0000N.gguf ... PREFIX-0000N-of-0000N.gguf

The first part holds every metadata entry of the source (copied byte for
byte) and each part the three split keys after them: split.no (u16, the
part's place from 0), split.count (u16, N), split.tensors.count (i32, the
tensors of the whole model). The tensors keep their order, about as many in
each part; each part's data section is aligned to 32 bytes (the first
part's to the source's general.alignment), each tensor's bytes copied as
they are. (llama.cpp loads the parts it writes: llama-simple on the
bundled model cut in three gave the unsplit file's text.)

  python3 tests/gguf_split.py IN.gguf PREFIX N   (prints the parts' paths)
"""
import struct
import sys

FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def _skip_value(b, pos, vtype):
    if vtype in FIXED:
        return pos + FIXED[vtype]
    if vtype == 8:
        (n,) = struct.unpack_from("<Q", b, pos)
        return pos + 8 + n
    if vtype == 9:
        et, n = struct.unpack_from("<IQ", b, pos)
        pos += 12
        if et in FIXED:
            return pos + n * FIXED[et]
        for _ in range(n):
            pos = _skip_value(b, pos, et)
        return pos
    raise ValueError("unknown GGUF value type %d" % vtype)


def _string(s):
    s = s.encode()
    return struct.pack("<Q", len(s)) + s


def _pad(n, a):
    return (a - n % a) % a


def split(src, prefix, n_parts):
    """Writes the parts; returns their paths."""
    b = open(src, "rb").read()
    magic, version, n_t, n_kv = struct.unpack_from("<4sIQQ", b, 0)
    if magic != b"GGUF" or version not in (2, 3):
        raise ValueError("%s: not a GGUF v2/v3 file" % src)
    pos = 24
    kv_start = pos
    align = 32
    for _ in range(n_kv):
        (klen,) = struct.unpack_from("<Q", b, pos)
        key = b[pos + 8:pos + 8 + klen].decode()
        pos += 8 + klen
        (vtype,) = struct.unpack_from("<I", b, pos)
        if key == "general.alignment":
            (align,) = struct.unpack_from("<I", b, pos + 4)
        pos = _skip_value(b, pos + 4, vtype)
    kv_raw = b[kv_start:pos]
    tensors = []  # (name, dims and type bytes, offset)
    for _ in range(n_t):
        (nlen,) = struct.unpack_from("<Q", b, pos)
        name = b[pos + 8:pos + 8 + nlen]
        pos += 8 + nlen
        (nd,) = struct.unpack_from("<I", b, pos)
        shape = b[pos:pos + 4 + 8 * nd + 4]
        pos += 4 + 8 * nd + 4
        (off,) = struct.unpack_from("<Q", b, pos)
        pos += 8
        tensors.append((name, shape, off))
    data = pos + _pad(pos, align)
    ends = sorted(off for _, _, off in tensors)[1:] + [len(b) - data]
    size = {off: end - off for off, end in zip(sorted(off for _, _, off in tensors), ends)}
    paths = []
    for k in range(n_parts):
        mine = tensors[len(tensors) * k // n_parts:len(tensors) * (k + 1) // n_parts]
        a = align if k == 0 else 32
        kvs = (kv_raw if k == 0 else b"") + _string("split.no") + struct.pack("<IH", 2, k) \
            + _string("split.count") + struct.pack("<IH", 2, n_parts) \
            + _string("split.tensors.count") + struct.pack("<Ii", 5, n_t)
        infos, blob = b"", b""
        for name, shape, off in mine:
            blob += b"\0" * _pad(len(blob), a)
            infos += struct.pack("<Q", len(name)) + name + shape + struct.pack("<Q", len(blob))
            blob += b[data + off:data + off + size[off]]
        head = struct.pack("<4sIQQ", b"GGUF", 3, len(mine), (n_kv if k == 0 else 0) + 3) + kvs + infos
        path = "%s-%05d-of-%05d.gguf" % (prefix, k + 1, n_parts)
        with open(path, "wb") as f:
            f.write(head + b"\0" * _pad(len(head), a) + blob)
        paths.append(path)
    return paths


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit("usage: gguf_split.py IN.gguf PREFIX N")
    print("\n".join(split(sys.argv[1], sys.argv[2], int(sys.argv[3]))))
