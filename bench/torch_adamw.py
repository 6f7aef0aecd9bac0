#!/usr/bin/env python3
"""zero's fused CUDA AdamW against torch.optim.AdamW(fused=True), same run, like for like.

For each size, in one invocation of this script:
  1. ours: runs build/cuda/bench_cuda_adam (make cuda) as a subprocess and parses its
     "RESULT {json}" line: fp16 grads -> fp32 master/m/v -> fp16 params in one kernel,
     28 bytes per parameter (read grad 2 + master/m/v 12, write master/m/v 12 + param 2);
  2. PyTorch, two variants of the usual mixed-precision step (fused AdamW needs grads in
     the params' dtype, fp32 here):
       fp32-grads  AdamW(fused=True).step() on fp32 params/grads (28 B/param: read p, g,
                   m, v; write p, m, v), then the fp16 model copy half.copy_(p) (6 B/param):
                   34 B/param;
       fp16-grads  starting where our kernel starts, from fp16 gradients: the fp32 grads
                   are filled from them first (g32.copy_(g16): 6 B/param), then the step
                   and the copy as above: 40 B/param.
Bandwidth is reported with each side's own bytes (GB/s = bytes/param x params / time), so
the columns compare how close each gets to the memory system, and times compare what a
training step pays. PyTorch's side is timed over --steps back-to-back steps between two
CUDA events (the GPU queue runs ahead of Python, so dispatch is hidden unless it is slower
than the GPU), or, with --graph, as replays of a CUDA graph of one step (capturable=True),
which removes Python and launch costs altogether. Medians of --runs such timings after
--warmup steps. Ours runs first, in its own process, so the two never share GPU memory.
Target: ours <= 0.8 x PyTorch's fp16-grads time.

    python3 bench/torch_adamw.py [--params 256M[,64M,...]] [--runs 20] [--warmup 3]
                                 [--steps 10] [--graph] [--tensors 1]
                                 [--bench build/cuda/bench_cuda_adam]

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


def run_torch(n, runs, warmup, tensors, steps, graph, fp16_grads):
    """Median ms per step of PyTorch's mixed-precision AdamW step (see the module text)."""
    import torch

    dev = torch.device("cuda")
    sizes = [n // tensors] * tensors
    sizes[-1] += n - sum(sizes)
    gen = torch.Generator(device=dev).manual_seed(1)
    params, halves, g16 = [], [], []
    for k in sizes:
        p = torch.nn.Parameter(torch.randn(k, device=dev, generator=gen) * 0.1)
        p.grad = torch.randn(k, device=dev, generator=gen) * 0.01
        params.append(p)
        halves.append(torch.empty(k, device=dev, dtype=torch.float16))
        if fp16_grads:
            g16.append(p.grad.to(torch.float16))
    opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01, fused=True, capturable=graph)
    p_grads = [p.grad for p in params]

    def copy_all(dst, src):  # one multi-tensor launch where this torch has it
        if hasattr(torch, "_foreach_copy_"):
            torch._foreach_copy_(dst, src)
        else:
            for d, s in zip(dst, src):
                d.copy_(s)

    def step():
        with torch.no_grad():
            if fp16_grads:
                copy_all(p_grads, g16)
            opt.step()
            copy_all(halves, params)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up (the first step creates the state) off the default stream
        for _ in range(max(warmup, 1)):
            step()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    run = step
    if graph:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            step()
        run = g.replay
        for _ in range(max(warmup, 1)):
            run()
        torch.cuda.synchronize()
    times = []
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    for _ in range(runs):
        start.record()
        for _ in range(steps):  # back to back: the GPU never waits for Python between steps
            run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / steps)
    name = torch.cuda.get_device_name(dev)
    version = torch.__version__
    del opt, params, halves, g16, p_grads
    torch.cuda.empty_cache()
    return statistics.median(times), name, version


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default="256M", help="comma-separated sizes (K/M/G suffixes)")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10, help="back-to-back PyTorch steps per timing")
    ap.add_argument("--graph", action="store_true", help="time PyTorch's step as CUDA graph replays")
    ap.add_argument("--tensors", type=int, default=1, help="split PyTorch's params into this many tensors")
    ap.add_argument("--bench", default=os.path.join(here, "..", "build", "cuda", "bench_cuda_adam"))
    args = ap.parse_args()
    if args.steps < 1 or args.runs < 1 or args.tensors < 1:
        sys.exit("torch_adamw.py: --steps, --runs and --tensors must be >= 1")
    if not os.path.exists(args.bench):
        sys.exit("torch_adamw.py: %s not found: run 'make cuda' first" % args.bench)
    try:
        import torch  # noqa: F401
    except ImportError:
        sys.exit("torch_adamw.py: PyTorch is not installed")
    if not torch.cuda.is_available():
        print("torch_adamw.py: skipped: no CUDA device")
        return
    torch_bytes = {False: 34, True: 40}  # fp32-grads, fp16-grads (see the module text)
    rows = []
    for n in [parse_count(x) for x in args.params.split(",")]:
        ours, _ = run_ours(args.bench, n, args.runs, args.warmup)
        if ours is None:
            print("torch_adamw.py: skipped: the bench saw no CUDA device")
            return
        t32, name, version = run_torch(ours["params"], args.runs, args.warmup, args.tensors, args.steps, args.graph,
                                       False)
        t16, _, _ = run_torch(ours["params"], args.runs, args.warmup, args.tensors, args.steps, args.graph, True)
        rows.append((ours, t32, t16, name, version))
    gbps = lambda b, n, ms: b * n / (ms * 1e-3) / 1e9  # noqa: E731
    print("zero fused AdamW (fp16 grads/params, fp32 master/m/v, %s B/param) vs torch.optim.AdamW(fused=True)"
          % rows[0][0].get("bytes_per_param", 28))
    print("device: %s, torch %s, median of %d runs, torch timed %s" %
          (rows[0][3], rows[0][4], args.runs,
           "as CUDA graph replays" if args.graph else "over %d back-to-back steps" % args.steps))
    print("%12s | %9s %9s | %9s %9s | %9s %9s | %8s %8s" %
          ("params", "zero ms", "zero GB/s", "t32 ms", "t32 GB/s", "t16 ms", "t16 GB/s", "z/t16", "target"))
    for ours, t32, t16, name, version in rows:
        n = ours["params"]
        ratio = ours["adam_ms"] / t16
        print("%12d | %9.3f %9.1f | %9.3f %9.1f | %9.3f %9.1f | %8.3f %8s" %
              (n, ours["adam_ms"], ours["adam_gbps"], t32, gbps(torch_bytes[False], n, t32), t16,
               gbps(torch_bytes[True], n, t16), ratio, "met" if ratio <= 0.8 else "MISSED"))
    for ours, t32, t16, name, version in rows:
        n = ours["params"]
        print("TORCH_COMPARE " + json.dumps({
            "device": name, "torch": version, "params": n, "graph": args.graph, "steps": args.steps,
            "zero_ms": ours["adam_ms"], "zero_gbps": ours["adam_gbps"], "zero_bytes_per_param": 28,
            "torch_fp32grads_ms": round(t32, 4), "torch_fp32grads_gbps": round(gbps(torch_bytes[False], n, t32), 1),
            "torch_fp32grads_bytes_per_param": torch_bytes[False],
            "torch_fp16grads_ms": round(t16, 4), "torch_fp16grads_gbps": round(gbps(torch_bytes[True], n, t16), 1),
            "torch_fp16grads_bytes_per_param": torch_bytes[True],
            "ratio_vs_fp16grads": round(ours["adam_ms"] / t16, 4), "ratio_vs_fp32grads": round(ours["adam_ms"] / t32, 4),
            "zero_vs_copy": ours["ratio"]}))


if __name__ == "__main__":
    main()
