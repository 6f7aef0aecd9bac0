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
Every timed step is interleaved: one repetition runs each variant once, in turn, so that
load from other processes falls on all of them alike; each figure is the median over --runs
repetitions after --warmup. Small sizes repeat the step inside one sample (at least ~4M
elements a sample). At one thread the ratios are taken on the process's CPU time (time
.process_time: the time another process holds the core is not counted; at one thread
every library's step runs on this thread), with the wall-clock ratio beside it; at two
threads on wall-clock time. Ratios are times: above 1, zero is faster. The load average
(os.getloadavg) is printed with every size. Before timing, m is checked bit for bit: zero's
host Adam and each torch.optim.AdamW form (single-tensor, foreach, fused) from the same p,
g, m over 5 steps (zero's m is torch's lerp, docs/optimizer.md).

    python3 bench/torch_adamw_cpu.py [--params 64K,256K,1M,4M,16M] [--threads 1,2] [--runs 9]
                                     [--warmup 2]
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


def parse_count(txt):
    txt = txt.strip().upper()
    return int(float(txt.rstrip("KMG")) * {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(txt[-1], 1))


def run_size(lib, torch, ds_adam, n, threads, runs, warmup):
    """Times every variant at n parameters on 'threads' threads, interleaved. Returns
    {name: (median wall seconds, median CPU seconds)} and DeepSpeed's failure, if any."""
    gen = torch.Generator().manual_seed(1)
    p32 = torch.rand(n, generator=gen) * 2 - 1
    g32 = (torch.rand(n, generator=gen) * 2 - 1) * 1e-2
    g16 = g32.half()
    zp, zm, zv = p32.clone(), torch.zeros(n), torch.zeros(n)
    o16, ob16 = torch.empty(n, dtype=torch.float16), torch.empty(n, dtype=torch.bfloat16)
    desc = Desc(1, 1e-3, 0.9, 0.999, 1e-8, 0.01)
    coefs = Coefs()

    def zero_fn(g, g_dtype, out, out_dtype):
        rng = Range(n, zp.data_ptr(), zm.data_ptr(), zv.data_ptr(), g.data_ptr(), g_dtype, out.data_ptr(),
                    out_dtype)

        def step():  # the per-step work: the step's constants, then the pass
            if lib.zero_adam_coefs_make(ctypes.byref(coefs), ctypes.byref(desc), 0.01, 10) != 0 or \
                    lib.zero_adam_host(ctypes.byref(rng), ctypes.byref(coefs), 1.0, 0, threads) != 0:
                raise RuntimeError(lib.zero_last_error().decode())
        return step

    fns = {
        "zero f16g f16p": zero_fn(g16, F16, o16, F16),
        "zero f16g bf16p": zero_fn(g16, F16, ob16, BF16),
        "zero f32g f16p": zero_fn(g32, F32, o16, F16),
        "zero f32g bf16p": zero_fn(g32, F32, ob16, BF16),
    }
    tp = torch.nn.Parameter(p32.clone())
    tp.grad = g32.clone()
    topt = torch.optim.AdamW([tp], lr=1e-3, weight_decay=0.01, fused=True)

    def torch_fn(out):
        def step():
            with torch.no_grad():
                topt.step()
                out.copy_(tp)
        return step
    fns["torch f16p"] = torch_fn(o16)
    fns["torch bf16p"] = torch_fn(ob16)
    ds_why = ""
    if ds_adam is not None:
        try:
            dp = torch.nn.Parameter(p32.clone())
            dp.grad = g32.clone()
            dopt = ds_adam([dp], lr=1e-3, weight_decay=0.01, adamw_mode=True)

            def ds_fn(out):
                def step():
                    with torch.no_grad():
                        dopt.step()
                        out.copy_(dp)
                return step
            fns["ds f16p"] = ds_fn(o16)
            fns["ds bf16p"] = ds_fn(ob16)
        except Exception as e:  # noqa: BLE001
            ds_why = "%s: %s" % (type(e).__name__, str(e).splitlines()[0] if str(e) else "")
    inner = max(1, (4 << 20) // n)
    samples = {k: ([], []) for k in fns}
    for rep in range(warmup + runs):
        for k, fn in fns.items():
            w0, c0 = time.perf_counter(), time.process_time()
            for _ in range(inner):
                fn()
            c1, w1 = time.process_time(), time.perf_counter()
            if rep >= warmup:
                samples[k][0].append((w1 - w0) / inner)
                samples[k][1].append((c1 - c0) / inner)
    return {k: (statistics.median(w), statistics.median(c)) for k, (w, c) in samples.items()}, ds_why


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default="64K,256K,1M,4M,16M")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--warmup", type=int, default=2)
    args = ap.parse_args()
    sizes = [parse_count(x) for x in args.params.split(",")]
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
        print("host AdamW step + half-precision param copy, median of %d interleaved, torch %s, deepspeed %s"
              % (args.runs, torch.__version__, "not run (%s)" % ds_why if ds_adam is None else
                 __import__("deepspeed").__version__))
        print("%-3s %9s %-5s %6s | %10s %10s %10s %10s | %9s %9s %9s | %s" % (
            "thr", "params", "param", "clock", "zero f16g", "zero f32g", "torch+cp", "ds+cp",
            "torch/z", "ds/z", "ds/z32", "load 1/5/15 min"))
        for threads in [int(x) for x in args.threads.split(",")]:
            torch.set_num_threads(threads)
            for n in sizes:
                res, why = run_size(lib, torch, ds_adam, n, threads, args.runs, args.warmup)
                ds_why = ds_why or why
                load = "%.1f %.1f %.1f" % os.getloadavg()
                for pk in ("f16p", "bf16p"):
                    # one thread: CPU time (then wall); two threads: wall only
                    for clock in ((1, 0) if threads == 1 else (0,)):
                        z16, z32 = res["zero f16g " + pk][clock], res["zero f32g " + pk][clock]
                        t, ds = res["torch " + pk][clock], res.get("ds " + pk, (None, None))[clock]
                        print("%-3d %9d %-5s %6s | %8.3fms %8.3fms %8.3fms %10s | %8.2fx %9s %9s | %s" % (
                            threads, n, pk[:-1], "cpu" if clock else "wall", z16 * 1e3, z32 * 1e3, t * 1e3,
                            "%.3fms" % (ds * 1e3) if ds else "-", t / z16,
                            "%.2fx" % (ds / z16) if ds else "-", "%.2fx" % (ds / z32) if ds else "-", load))
                sys.stdout.flush()
    if ds_why:
        print("deepspeed: %s" % ds_why)
    print("ratios: the other's time / zero's (fp16 grads; ds/z32: zero with fp32 grads, like for like); "
          "target >= 1.3x DeepSpeed + copy")


if __name__ == "__main__":
    main()
