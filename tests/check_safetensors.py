#!/usr/bin/env python3
"""Checks zero's safetensors exports with the reference `safetensors` package and numpy.

usage: check_safetensors.py DIR
DIR holds model-f32/f16/bf16.safetensors (exported by zero_checkpoint_export), expect.json
(names, shapes) and expect-f32.bin (the fp32 master values, written by the engine test).
F32 and F16 load through safetensors.numpy.load_file; numpy has no bfloat16, so BF16 goes
through safetensors.deserialize (the package's own parser) and is compared as raw bits with
round-to-nearest-even of the fp32 master computed here in numpy."""
import json
import os
import sys

import numpy as np
import safetensors
import safetensors.numpy as stnp


def bf16_bits(x):
    u = x.view(np.uint32).astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


def main():
    d = sys.argv[1]
    expect = json.load(open(os.path.join(d, "expect.json")))
    raw = np.fromfile(os.path.join(d, "expect-f32.bin"), dtype="<f4")
    fails = 0
    checks = 0
    f32 = stnp.load_file(os.path.join(d, "model-f32.safetensors"))
    f16 = stnp.load_file(os.path.join(d, "model-f16.safetensors"))
    with open(os.path.join(d, "model-bf16.safetensors"), "rb") as fh:
        bf = {name: spec for name, spec in safetensors.deserialize(fh.read())}
    names = [t["name"] for t in expect]
    for got, label in ((set(f32), "f32"), (set(f16), "f16"), (set(bf), "bf16")):
        checks += 1
        if got != set(names):
            print(f"FAIL {label}: names {sorted(got)} != {sorted(names)}")
            fails += 1
    for t in expect:
        name, shape = t["name"], tuple(t["shape"])
        n = int(np.prod(shape))
        want = raw[t["offset"] // 4: t["offset"] // 4 + n].reshape(shape)
        a = f32.get(name)
        checks += 1
        if a is None or a.dtype != np.float32 or a.shape != shape or not np.array_equal(
                a.view(np.uint32), want.view(np.uint32)):
            print(f"FAIL f32 {name}: dtype/shape/values differ")
            fails += 1
        b = f16.get(name)
        checks += 1
        if b is None or b.dtype != np.float16 or b.shape != shape or not np.array_equal(
                b.view(np.uint16), want.astype(np.float16).view(np.uint16)):
            print(f"FAIL f16 {name}: dtype/shape/values differ")
            fails += 1
        c = bf.get(name)
        checks += 1
        if c is None or c["dtype"] != "BF16" or tuple(c["shape"]) != shape or not np.array_equal(
                np.frombuffer(bytes(c["data"]), dtype="<u2").reshape(shape), bf16_bits(want)):
            print(f"FAIL bf16 {name}: dtype/shape/bits differ")
            fails += 1
    print(f"check_safetensors: {checks - fails} of {checks} checks passed "
          f"({len(names)} tensors, f32/f16 via safetensors.numpy, bf16 via safetensors.deserialize)")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
