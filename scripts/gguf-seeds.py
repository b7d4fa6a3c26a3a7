#!/usr/bin/env python3
"""Writes the seed inputs of the GGUF fuzz harness (tests/fuzz/corpus/gguf): small valid files
of each version, alignment, metadata type and tensor type clffn reads, plus a few damaged ones,
from which libFuzzer's mutations start. Run once; libFuzzer's -merge adds what it finds.

    python3 scripts/gguf-seeds.py tests/fuzz/corpus/gguf
"""
import hashlib
import os
import struct
import sys


def s(text):
    b = text.encode()
    return struct.pack("<Q", len(b)) + b


def kv(key, vtype, value):
    out = s(key) + struct.pack("<I", vtype)
    if vtype == 8:
        return out + s(value)
    if vtype == 9:  # (elem type, list)
        et, items = value
        out += struct.pack("<IQ", et, len(items))
        fmt = {4: "<I", 6: "<f", 0: "<B", 10: "<Q"}.get(et)
        for it in items:
            out += s(it) if et == 8 else struct.pack(fmt, it)
        return out
    fmt = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
           10: "<Q", 11: "<q", 12: "<d"}[vtype]
    return out + struct.pack(fmt, value)


TYPES = {0: (1, 4), 1: (1, 2), 2: (32, 18), 8: (32, 34), 30: (1, 2), 12: (256, 144)}


def gguf(version=3, kvs=(), tensors=(), align=None):
    """tensors: (name, type, ne list); data laid out aligned, filled with a byte pattern"""
    a = align or 32
    kvs = list(kvs)
    if align:
        kvs.append(kv("general.alignment", 4, align))
    infos, blobs, off = b"", [], 0
    for name, t, ne in tensors:
        block, size = TYPES[t]
        n = 1
        for d in ne:
            n *= d
        nbytes = n // block * size
        infos += s(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne)
        infos += struct.pack("<IQ", t, off)
        blobs.append((off, bytes((i * 37 + 11) % 251 for i in range(nbytes))))
        off += (nbytes + a - 1) // a * a
    head = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kvs)) + b"".join(kvs) + infos
    start = (len(head) + a - 1) // a * a
    data = bytearray(off)
    for o, b in blobs:
        data[o:o + len(b)] = b
    return head + bytes(start - len(head)) + bytes(data)


def main(folder):
    os.makedirs(folder, exist_ok=True)
    arch = kv("general.architecture", 8, "llama")
    ffn = [("blk.0.ffn_gate.weight", 8, [64, 96]), ("blk.0.ffn_up.weight", 8, [64, 96]),
           ("blk.0.ffn_down.weight", 8, [96, 64])]
    seeds = [
        gguf(3, [arch, kv("llama.block_count", 4, 1)], ffn),
        gguf(2, [arch], [(n, 2, ne) for n, _, ne in ffn]),
        gguf(3, [arch], [(n, 1, ne) for n, _, ne in ffn], align=64),
        gguf(3, [kv("general.name", 8, "tiny"), kv("x.f", 6, 0.5), kv("x.b", 7, True),
                 kv("x.arr", 9, (4, [1, 2, 3])), kv("x.strs", 9, (8, ["a", "bc"])),
                 kv("x.i64", 11, -5), kv("x.u64", 10, 7), kv("x.d", 12, 1.5)],
             [("w", 30, [32, 2]), ("b", 0, [5]), ("k", 12, [256, 1]), ("e", 2, [32, 4, 3])]),
        gguf(3, [], []),
        gguf(3, [arch, kv("llama.expert_used_count", 4, 2)],
             [("blk.0.ffn_gate_inp.weight", 0, [64, 4]),
              ("blk.0.ffn_gate_exps.weight", 8, [64, 32, 4]),
              ("blk.0.ffn_up_exps.weight", 8, [64, 32, 4]),
              ("blk.0.ffn_down_exps.weight", 8, [32, 64, 4])]),
    ]
    good = list(seeds)
    seeds.append(good[0][:100])                    # truncated in the tensor infos
    seeds.append(good[1][:-7])                     # truncated in the data
    seeds.append(b"GGUF" + struct.pack("<I", 1) + good[0][8:])  # version 1
    seeds.append(b"GGUF" + struct.pack(">I", 3) + good[0][8:])  # big-endian
    for seed in seeds:
        name = hashlib.sha1(seed).hexdigest()
        with open(os.path.join(folder, name), "wb") as f:
            f.write(seed)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/fuzz/corpus/gguf")
