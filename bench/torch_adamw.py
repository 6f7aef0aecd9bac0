#!/usr/bin/env python3
"""zero's fused CUDA AdamW against torch.optim.AdamW(fused=True) + the fp16 copy, same run.

For each size, in one invocation of this script:
  1. ours: runs build/cuda/bench_cuda_adam (make cuda) as a subprocess and parses its
     "RESULT {json}" line: fp16 grads -> fp32 master/m/v -> fp16 params in one kernel;
  2. PyTorch: fp32 master params with fp32 grads, torch.optim.AdamW(fused=True).step(), then
     the fp16 model copy half.copy_(master): the usual mixed-precision step in PyTorch
     (fused AdamW needs grads in the params' dtype).
Both are timed with CUDA events, medians of --runs after --warmup. Ours runs first, in its
own process, so the two never share GPU memory. Target: ours <= 0.8 x PyTorch's time.

    python3 bench/torch_adamw.py [--params 256M[,64M,...]] [--runs 20] [--warmup 3]
                                 [--bench build/cuda/bench_cuda_adam] [--tensors 1]

Prints one table and a final "TORCH_COMPARE {json}" line per size.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys


def parse_count(text):
    text = text.strip().upper()
    mult = 1
    if text.endswith("K"):
        mult, text = 1 << 10, text[:-1]
    elif text.endswith("M"):
        mult, text = 1 << 20, text[:-1]
    elif text.endswith("G"):
        mult, text = 1 << 30, text[:-1]
    return int(float(text) * mult)


def run_ours(bench, n, runs, warmup):
    proc = subprocess.run([bench, "--params", str(n), "--runs", str(runs), "--warmup", str(warmup)],
                          capture_output=True, text=True)
    out = proc.stdout
    if proc.returncode != 0:  # show why (the bench prints the failing call on stderr)
        raise RuntimeError("%s exited with %d:\n%s%s" % (bench, proc.returncode, out, proc.stderr))
    for line in out.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):]), out
    if "skipped" in out:
        return None, out
    raise RuntimeError("no RESULT line from %s:\n%s" % (bench, out))


def run_torch(n, runs, warmup, tensors):
    import torch

    dev = torch.device("cuda")
    sizes = [n // tensors] * tensors
    sizes[-1] += n - sum(sizes)
    gen = torch.Generator(device=dev).manual_seed(1)
    params = []
    halves = []
    for k in sizes:
        p = torch.nn.Parameter(torch.randn(k, device=dev, generator=gen) * 0.1)
        p.grad = torch.randn(k, device=dev, generator=gen) * 0.01
        params.append(p)
        halves.append(torch.empty(k, device=dev, dtype=torch.float16))
    opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01, fused=True)

    def step():
        opt.step()
        with torch.no_grad():
            for h, p in zip(halves, params):
                h.copy_(p)

    for _ in range(max(warmup, 1)):  # the first step creates the state
        step()
    torch.cuda.synchronize()
    times = []
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    for _ in range(runs):
        start.record()
        step()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    name = torch.cuda.get_device_name(dev)
    version = torch.__version__
    del opt, params, halves
    torch.cuda.empty_cache()
    return statistics.median(times), name, version


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default="256M", help="comma-separated sizes (K/M/G suffixes)")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--tensors", type=int, default=1, help="split PyTorch's params into this many tensors")
    ap.add_argument("--bench", default=os.path.join(here, "..", "build", "cuda", "bench_cuda_adam"))
    args = ap.parse_args()
    if not os.path.exists(args.bench):
        sys.exit("torch_adamw.py: %s not found: run 'make cuda' first" % args.bench)
    try:
        import torch  # noqa: F401
    except ImportError:
        sys.exit("torch_adamw.py: PyTorch is not installed")
    if not torch.cuda.is_available():
        print("torch_adamw.py: skipped: no CUDA device")
        return
    rows = []
    for n in [parse_count(x) for x in args.params.split(",")]:
        ours, _ = run_ours(args.bench, n, args.runs, args.warmup)
        if ours is None:
            print("torch_adamw.py: skipped: the bench saw no CUDA device")
            return
        t_ms, name, version = run_torch(ours["params"], args.runs, args.warmup, args.tensors)
        rows.append((ours, t_ms, name, version))
    print("zero fused AdamW (fp16 grads/params, fp32 master/m/v) vs torch.optim.AdamW(fused=True) + fp16 copy")
    print("device: %s, torch %s, median of %d runs" % (rows[0][2], rows[0][3], args.runs))
    print("%12s %12s %12s %10s %12s %8s" % ("params", "zero ms", "torch ms", "zero/torch", "zero GB/s", "target"))
    for ours, t_ms, name, version in rows:
        ratio = ours["adam_ms"] / t_ms
        print("%12d %12.3f %12.3f %10.3f %12.1f %8s" % (ours["params"], ours["adam_ms"], t_ms, ratio, ours["adam_gbps"],
                                                      "met" if ratio <= 0.8 else "MISSED"))
    for ours, t_ms, name, version in rows:
        print("TORCH_COMPARE " + json.dumps({"device": name, "torch": version, "params": ours["params"],
                                             "zero_ms": ours["adam_ms"], "torch_ms": round(t_ms, 4),
                                             "ratio": round(ours["adam_ms"] / t_ms, 4),
                                             "zero_vs_copy": ours["ratio"]}))


if __name__ == "__main__":
    main()
