#!/usr/bin/env python3
"""Builds fuzz/corpus/{ckpt,safetensors}: valid seeds taken from a real checkpoint and
export, plus malformed variants (truncations, flipped bytes, bad sizes, bad JSON).

usage: make_corpus.py CKPT_DIR SAFETENSORS_FILE OUT_DIR"""
import glob
import os
import struct
import sys
import zlib  # noqa: F401  (CRC32C is not in zlib; the harness fixes checksums itself)


def write(d, name, data):
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def main():
    ckdir, stfile, out = sys.argv[1], sys.argv[2], sys.argv[3]
    man = open(os.path.join(ckdir, "zero.manifest"), "rb").read()
    shard = open(sorted(glob.glob(os.path.join(ckdir, "zero-*-00000.shard")))[0], "rb").read()
    seed = struct.pack("<I", len(man)) + man + shard[:4096]
    d = os.path.join(out, "ckpt")
    write(d, "valid", seed)
    write(d, "manifest-only", struct.pack("<I", len(man)) + man)
    for cut in (8, 100, 183, 184, len(man) // 2, len(man) - 5):
        m = man[:cut] + b"\0\0\0\0"
        write(d, f"truncated-{cut}", struct.pack("<I", len(m)) + m)
    for off, val in ((12, 1), (16, 7), (32, 0), (36, 9), (40, 5), (44, 0), (48, 0), (52, 255),
                     (56, 0x80), (64, 3), (112, 0xff), (124, 0), (184, 0xff), (200, 0xff)):
        m = bytearray(man)
        if off < len(m) - 4:
            m[off] ^= val
            write(d, f"flip-{off}", struct.pack("<I", len(m)) + bytes(m) + shard[:4096])
    s = bytearray(shard[:4096])
    for off in (8, 12, 16, 24, 28, 32, 64, 72, 80):
        t = bytearray(s)
        t[off] ^= 0x41
        write(d, f"shard-flip-{off}", struct.pack("<I", len(man)) + man + bytes(t))
    st = open(stfile, "rb").read()
    d = os.path.join(out, "safetensors")
    write(d, "valid", st)
    (hn,) = struct.unpack("<Q", st[:8])
    hdr = st[8:8 + hn]
    data = st[8 + hn:]

    def mk(h, dat=b""):
        return struct.pack("<Q", len(h)) + h + dat

    write(d, "empty-object", mk(b"{}"))
    write(d, "metadata-only", mk(b'{"__metadata__":{"a":"b"}}'))
    write(d, "truncated-header", mk(hdr[: hn // 2]))
    write(d, "truncated-data", mk(hdr, data[: len(data) // 2]))
    write(d, "huge-length", struct.pack("<Q", 1 << 62) + hdr)
    bad = [
        b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}',
        b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}',
        b'{"a":{"dtype":"F32","shape":[18446744073709551615,2],"data_offsets":[0,8]}}',
        b'{"a":{"dtype":"F32","shape":[1,1,1,1,1,1,1,1,1],"data_offsets":[0,4]}}',
        b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}',
        b'{"a":{"dtype":"F32","shape":[],"data_offsets":[0,4]},"b":{"dtype":"BF16","shape":[0],"data_offsets":[4,4]}}',
        b'{"a\\u0041\\"":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}}',
        b'{"a":{"dtype":"F32","shape":[01],"data_offsets":[0,4]}}',
        b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":1}}',
        b'{"__metadata__":{"a":[1,{"b":[[[[]]]]}]},"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}',
        b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}} trailing',
        b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},}',
        b'{"\x01":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}',
        # __metadata__ that is not an object of strings; names that are not UTF-8
        b'{"__metadata__": tttt,"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}',
        b'{"__metadata__":{"a":1},"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}',
        b'{"__metadata__":{},"__metadata__":{},"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}',
        b'{"\xff\xfe":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}',
        b'{"\xc0\x80":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}',
        b'{"\\ud800":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}',
        b'{"\\ud83d\\ude00":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}',
    ]
    for i, h in enumerate(bad):
        write(d, f"bad-{i}", mk(h, b"\0" * 16))
    print(f"corpus: {len(os.listdir(os.path.join(out, 'ckpt')))} checkpoint inputs, "
          f"{len(os.listdir(d))} safetensors inputs")


if __name__ == "__main__":
    main()
