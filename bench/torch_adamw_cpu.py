#!/usr/bin/env python3
"""zero's host Adam against PyTorch's fused CPU AdamW and DeepSpeed's CPU Adam, same run.

The mixed-precision step each library offers on the CPU, per parameter:
  zero        zero_adam_host: fp16 (or fp32) grads -> fp32 master/m/v -> fp16 or bf16 param,
              one pass (the library built from ../zero.h into a temporary shared object
              with cc -O3 -march=native, called through ctypes);
  torch       torch.optim.AdamW(fused=True).step() on fp32 params and grads, then the
              half-precision model copy p16.copy_(p);
  deepspeed   deepspeed.ops.adam.DeepSpeedCPUAdam (adamw_mode) .step() on fp32 params and
              grads, then the same copy (its step has no fused copy in this version);
              skipped with the reason when DeepSpeed or its JIT-built op is missing.
Each figure is the median of --runs timed steps after --warmup, on --threads threads
(torch.set_num_threads; DeepSpeed's OpenMP loop follows it). Ratios are times: above 1,
zero is faster. Before timing, m is checked bit for bit: zero's host Adam and each
torch.optim.AdamW form (single-tensor, foreach, fused) from the same p, g, m over 5
steps (zero's m is torch's lerp, docs/optimizer.md).

    python3 bench/torch_adamw_cpu.py [--params 16M] [--threads 1,2] [--runs 7] [--warmup 2]
"""
import argparse
import ctypes
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
F32, F16, BF16 = 1, 2, 3


class Desc(ctypes.Structure):
    _fields_ = [("mode", ctypes.c_int), ("lr", ctypes.c_double), ("beta1", ctypes.c_double),
                ("beta2", ctypes.c_double), ("eps", ctypes.c_double), ("weight_decay", ctypes.c_double)]


class Coefs(ctypes.Structure):
    _fields_ = [(n, ctypes.c_float) for n in ("beta1", "one_minus_beta1", "beta2", "one_minus_beta2",
                                              "step_size", "inv_sqrt_bc2", "eps", "neg_lr_wd", "l2")]


class Range(ctypes.Structure):
    _fields_ = [("numel", ctypes.c_size_t), ("master", ctypes.c_void_p), ("m", ctypes.c_void_p),
                ("v", ctypes.c_void_p), ("grad", ctypes.c_void_p), ("grad_dtype", ctypes.c_int),
                ("param", ctypes.c_void_p), ("param_dtype", ctypes.c_int)]


def build_zero(tmp):
    src = os.path.join(tmp, "zero_so.c")
    so = os.path.join(tmp, "libzero_adam.so")
    with open(src, "w") as f:
        f.write('#define ZERO_IMPLEMENTATION\n#include "zero.h"\n')
    subprocess.run([os.environ.get("CC", "cc"), "-O3", "-march=native", "-shared", "-fPIC", "-pthread",
                    "-I", ROOT, src, "-o", so, "-lm"], check=True)
    lib = ctypes.CDLL(so)
    lib.zero_adam_host.argtypes = [ctypes.POINTER(Range), ctypes.POINTER(Coefs), ctypes.c_float, ctypes.c_int,
                                   ctypes.c_int]
    lib.zero_adam_coefs_make.argtypes = [ctypes.POINTER(Coefs), ctypes.POINTER(Desc), ctypes.c_double,
                                         ctypes.c_int64]
    lib.zero_last_error.restype = ctypes.c_char_p
    return lib


def zero_step(lib, t, p, m, v, g, g_dtype, out, out_dtype, threads, lr=1e-3, wd=0.01):
    d = Desc(1, lr, 0.9, 0.999, 1e-8, wd)
    c = Coefs()
    if lib.zero_adam_coefs_make(ctypes.byref(c), ctypes.byref(d), wd, t) != 0:
        raise RuntimeError(lib.zero_last_error().decode())
    r = Range(p.numel(), p.data_ptr(), m.data_ptr(), v.data_ptr(), g.data_ptr(), g_dtype,
              out.data_ptr() if out is not None else None, out_dtype)
    if lib.zero_adam_host(ctypes.byref(r), ctypes.byref(c), 1.0, 0, threads) != 0:
        raise RuntimeError(lib.zero_last_error().decode())


def check_m(lib, torch):
    n = 1 << 20
    gen = torch.Generator().manual_seed(0)
    p0 = torch.rand(n, generator=gen) * 2 - 1
    grads = [(torch.rand(n, generator=gen) * 2 - 1) * 10.0 ** -t for t in range(1, 6)]
    lines = []
    for form in ("single-tensor", "foreach", "fused"):
        p = torch.nn.Parameter(p0.clone())
        kw = {"fused": True} if form == "fused" else {"foreach": form == "foreach"}
        opt = torch.optim.AdamW([p], lr=1e-3, weight_decay=0.01, **kw)
        zp, zm, zv = p0.clone(), torch.zeros(n), torch.zeros(n)
        differ = 0
        for t, g in enumerate(grads, 1):
            p.grad = g.clone()
            opt.step()
            zero_step(lib, t, zp, zm, zv, g, F32, None, 0, 1)
            differ += int((opt.state[p]["exp_avg"].view(torch.int32) != zm.view(torch.int32)).sum())
        lines.append("%s %s" % (form, "m bit-identical over 5 steps" if differ == 0 else "%d m differ" % differ))
    return lines


def median_time(fn, runs, warmup):
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default="16M")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=2)
    args = ap.parse_args()
    txt = args.params.upper()
    n = int(float(txt.rstrip("KMG")) * {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(txt[-1], 1))
    try:
        import torch
    except ImportError:
        sys.exit("torch_adamw_cpu.py: PyTorch is not installed")
    ds_adam, ds_why = None, ""
    try:
        from deepspeed.ops.adam import DeepSpeedCPUAdam as ds_adam  # noqa: N813
    except Exception as e:  # noqa: BLE001 (any import failure is a skip with its reason)
        ds_why = "%s: %s" % (type(e).__name__, str(e).splitlines()[0] if str(e) else "")
    with tempfile.TemporaryDirectory() as tmp:
        lib = build_zero(tmp)
        for line in check_m(lib, torch):
            print("check:", line)
        gen = torch.Generator().manual_seed(1)
        p32 = torch.rand(n, generator=gen) * 2 - 1
        g32 = (torch.rand(n, generator=gen) * 2 - 1) * 1e-2
        g16 = g32.half()
        rows = []
        for threads in [int(x) for x in args.threads.split(",")]:
            torch.set_num_threads(threads)
            res = {}
            zp, zm, zv = p32.clone(), torch.zeros(n), torch.zeros(n)
            o16, ob16 = torch.empty(n, dtype=torch.float16), torch.empty(n, dtype=torch.bfloat16)
            res["zero f16g f16p"] = median_time(lambda: zero_step(lib, 10, zp, zm, zv, g16, F16, o16, F16, threads),
                                                args.runs, args.warmup)
            res["zero f16g bf16p"] = median_time(lambda: zero_step(lib, 10, zp, zm, zv, g16, F16, ob16, BF16, threads),
                                                 args.runs, args.warmup)
            res["zero f32g f16p"] = median_time(lambda: zero_step(lib, 10, zp, zm, zv, g32, F32, o16, F16, threads),
                                                args.runs, args.warmup)
            res["zero f32g bf16p"] = median_time(lambda: zero_step(lib, 10, zp, zm, zv, g32, F32, ob16, BF16, threads),
                                                 args.runs, args.warmup)
            tp = torch.nn.Parameter(p32.clone())
            tp.grad = g32.clone()
            topt = torch.optim.AdamW([tp], lr=1e-3, weight_decay=0.01, fused=True)

            def torch_step(out):
                with torch.no_grad():
                    topt.step()
                    out.copy_(tp)
            res["torch f16p"] = median_time(lambda: torch_step(o16), args.runs, args.warmup)
            res["torch bf16p"] = median_time(lambda: torch_step(ob16), args.runs, args.warmup)
            if ds_adam is not None:
                try:
                    dp = torch.nn.Parameter(p32.clone())
                    dp.grad = g32.clone()
                    dopt = ds_adam([dp], lr=1e-3, weight_decay=0.01, adamw_mode=True)

                    def ds_step(out):
                        with torch.no_grad():
                            dopt.step()
                            out.copy_(dp)
                    res["ds f16p"] = median_time(lambda: ds_step(o16), args.runs, args.warmup)
                    res["ds bf16p"] = median_time(lambda: ds_step(ob16), args.runs, args.warmup)
                except Exception as e:  # noqa: BLE001
                    ds_why = "%s: %s" % (type(e).__name__, str(e).splitlines()[0] if str(e) else "")
                    ds_adam = None
            rows.append((threads, res))
    print("host AdamW step + half-precision param copy, %d params, median of %d, torch %s, deepspeed %s"
          % (n, args.runs, torch.__version__, "not run (%s)" % ds_why if ds_adam is None else
             __import__("deepspeed").__version__))
    print("%-8s %-6s %9s %9s %9s | %9s %9s | %10s %10s %10s" % ("threads", "param", "zero f16g", "zero f32g",
                                                               "torch", "deepspeed", "", "torch/zero", "ds/zero",
                                                               "ds/zero32"))
    for threads, res in rows:
        for pk in ("f16p", "bf16p"):
            z16, z32, t = res["zero f16g " + pk], res["zero f32g " + pk], res["torch " + pk]
            ds = res.get("ds " + pk)
            print("%-8d %-6s %8.1fms %8.1fms %8.1fms | %9s %9s | %9.2fx %10s %10s" % (
                threads, pk[:-1], z16 * 1e3, z32 * 1e3, t * 1e3, "%.1fms" % (ds * 1e3) if ds else "-", "",
                t / z16, "%.2fx" % (ds / z16) if ds else "-", "%.2fx" % (ds / z32) if ds else "-"))
    print("ratios: the other's time / zero's (fp16 grads; ds/zero32: zero with fp32 grads, like for like); "
          "target >= 1.3x DeepSpeed + copy")


if __name__ == "__main__":
    main()
