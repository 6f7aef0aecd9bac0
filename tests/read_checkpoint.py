#!/usr/bin/env python3
"""An independent reader of zero checkpoints, written from docs/checkpoint.md alone (no
library code): parses the manifest and every shard file, checks sizes and every CRC32C,
reassembles each tensor's fp32 master, and compares with the values the engine reported;
reads the client state (manifest version 2) and compares it with EXPECT_CLIENT_BIN.

usage: read_checkpoint.py CKPT_DIR EXPECT_JSON EXPECT_F32_BIN [EXPECT_CLIENT_BIN]"""
import json
import os
import struct
import sys

import numpy as np

_T = []
for i in range(256):
    c = i
    for _ in range(8):
        c = (c >> 1) ^ (0x82F63B78 if c & 1 else 0)
    _T.append(c)


def crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c = (c >> 8) ^ _T[(c ^ b) & 0xFF]
    return c ^ 0xFFFFFFFF


def main():
    d, expect_json, expect_bin = sys.argv[1:4]
    expect_client = sys.argv[4] if len(sys.argv) > 4 else None
    assert crc32c(b"123456789") == 0xE3069283
    m = open(os.path.join(d, "zero.manifest"), "rb").read()
    assert m[:8] == b"ZEROMANI", "magic"
    version, _, total, gen = struct.unpack_from("<IIQQ", m, 8)
    assert version in (1, 2, 3) and total == len(m), "version/size"
    assert struct.unpack_from("<I", m, len(m) - 4)[0] == crc32c(m[:-4]), "manifest crc"
    world, stage, dtype, align, ng, nt = struct.unpack_from("<6I", m, 32)
    (step,) = struct.unpack_from("<q", m, 56)
    psize = {1: 4, 2: 2, 3: 2}[dtype]
    at = 184
    groups = []
    for _ in range(ng):
        groups.append(struct.unpack_from("<3Q", m, at))
        at += 24
    tensors = []
    for _ in range(nt):
        (ln,) = struct.unpack_from("<I", m, at)
        name = m[at + 4:at + 4 + ln].decode()
        at += 4 + ln
        g, flags, off, numel, ndim = struct.unpack_from("<IIQQI", m, at)
        at += 28
        dims = struct.unpack_from(f"<{ndim}Q", m, at)
        at += 8 * ndim
        tensors.append((name, g, off, numel, dims))
    files = []
    for _ in range(world):
        files.append(struct.unpack_from("<QI", m, at))
        at += 16
    client_bytes, client_crc = 0, 0
    if version >= 2:
        client_bytes, client_crc = struct.unpack_from("<QI", m, at)
        at += 16
    hparams = []
    if version >= 3:  # per tensor: f64 lr multiplier, f64 weight decay (-1: the default)
        for _ in range(nt):
            hparams.append(struct.unpack_from("<2d", m, at))
            at += 16
    assert at == len(m) - 4, "manifest length"
    client = b""
    if client_bytes:
        path = os.path.join(d, f"zero-{gen:016x}.client")
        client = open(path, "rb").read()
        assert len(client) == client_bytes, f"{path}: size"
        assert crc32c(client) == client_crc, f"{path}: crc"
    H = 64 + 32 * 4 * ng + 4
    master = {}
    for name, g, off, numel, dims in tensors:
        master[name] = np.zeros(numel, dtype="<f4")
    for q in range(world):
        path = os.path.join(d, f"zero-{gen:016x}-{q:05d}.shard")
        s = open(path, "rb").read()
        assert len(s) == files[q][0], f"{path}: size"
        assert s[:8] == b"ZEROSHRD" and struct.unpack_from("<I", s, H - 4)[0] == crc32c(s[:H - 4]) \
            == files[q][1], f"{path}: header"
        v, hb, g2, rank, w2, nsec, pd, fsize = struct.unpack_from("<IIQIIIIQ", s, 8)
        assert (v, hb, g2, rank, w2, nsec, pd, fsize) == (1, H, gen, q, world, 4 * ng, dtype, len(s))
        for i in range(4 * ng):
            kind, grp, soff, sbytes, crc, _ = struct.unpack_from("<IIQQII", s, 64 + 32 * i)
            assert crc32c(s[soff:soff + sbytes]) == crc, f"{path}: section {i} crc"
            if kind != 1:
                continue
            gnumel, shard, used = groups[grp]
            sec = np.frombuffer(s[soff:soff + sbytes], dtype="<f4")
            lo, hi = q * shard, (q + 1) * shard
            for name, g, off, numel, dims in tensors:
                if g != grp:
                    continue
                a, b = max(lo, off), min(hi, off + numel)
                if a < b:
                    master[name][a - off:b - off] = sec[a - lo:b - lo]
    expect = json.load(open(expect_json))
    raw = np.fromfile(expect_bin, dtype="<f4")
    bad = 0
    for t in expect:
        n = int(np.prod(t["shape"]))
        want = raw[t["offset"] // 4: t["offset"] // 4 + n]
        if not np.array_equal(master[t["name"]].view(np.uint32), want.view(np.uint32)):
            print(f"FAIL {t['name']}: master differs")
            bad += 1
    if expect_client is not None and client != open(expect_client, "rb").read():
        print("FAIL client state differs")
        bad += 1
    print(f"read_checkpoint: generation {gen}, step {step}, world {world}, stage {stage}, "
          f"{nt} tensors, {world} shard files, {client_bytes} bytes of client state: every "
          f"CRC32C ok, masters and client state "
          f"{'identical' if not bad else 'DIFFER'} to the engine's")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
