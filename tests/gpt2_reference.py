#!/usr/bin/env python3
"""The GPT-2 example (examples/train_gpt2.c) against PyTorch and Hugging Face.

Builds GPT2LMHeadModel(GPT2Config(...)) in fp32 with every dropout at zero, saves its random
initial weights as safetensors, and trains it with torch.optim.AdamW on the batches the C
example reads (tokens from the same corpus, the same order, the same schedule, weight decay on
2-D weights only, gradient clipping). The C example starts from that file (--init) and must
show:

  forward   step-0 loss and logits within 1e-5 relative of PyTorch's
  fp32      every step's loss within 1e-4 relative of PyTorch's: 1 rank; 4 ranks (threads) at
            stages 0, 1, 2, 3 (and the stages bit-identical to each other); mpirun -np 4
            (train_gpt2_mpi, skipped without it)
  bf16/fp16 every step's loss within the derived bound of PyTorch's emulation of the same mixed
            precision (docs/gpt2.md): |L_zero - L_emu| <= 2 u K(s) L(s) + 1e-4 L(s), where u
            is the dtype's unit roundoff and K(s) = sum_i |w_i dL/dw_i| / L, the loss's
            condition number with respect to the params, measured by PyTorch at step s
  export    the checkpoint exported by zero-ckpt loads into GPT2LMHeadModel and its val loss
            equals the C model's within 1e-5 relative
  resume    save at step 50, resume to 100 = the straight run, bit for bit (every logged loss
            and the final params' checksum), at 1 rank stage 0 and at 4 ranks stage 3 (saved at
            stage 1, resumed at stage 3)

Ends with "N passed, N failed, N skipped". --quick: fewer steps and checks (CI).
"""
import argparse
import math
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import save_file, load_file
import transformers
from transformers import GPT2Config, GPT2LMHeadModel

transformers.logging.set_verbosity_error()  # not its notes about the small config

# --- the example's fixed settings (examples/gpt2_common.h) ------------------------------------
BETA1, BETA2, EPS, WD = 0.9, 0.95, 1e-8, 0.1


def corpus_tokens(path, vocab):
    """The tokens of --data path as gpt2_data_load reads them: a directory's regular files in
    strcmp order of their names (bytes), a text file, or an llm.c .bin; the last tenth is val."""
    if os.path.isdir(path):
        names = sorted((n for n in os.listdir(path) if not n.startswith('.')
                        and os.path.isfile(os.path.join(path, n))), key=lambda s: s.encode())
        raw = b''.join(open(os.path.join(path, n), 'rb').read() for n in names)
        tok = np.frombuffer(raw, dtype=np.uint8).astype(np.int64)
    elif path.endswith('.bin'):
        hdr = np.fromfile(path, dtype=np.int32, count=256)
        tok = np.fromfile(path, dtype=np.uint16, offset=1024, count=int(hdr[2])).astype(np.int64)
    else:
        tok = np.frombuffer(open(path, 'rb').read(), dtype=np.uint8).astype(np.int64)
    nval = len(tok) // 10
    return tok[:len(tok) - nval], tok[len(tok) - nval:]


def stride_of(n):
    """gpt2_stride: the smallest integer >= 0.618 n coprime with n."""
    if n <= 2:
        return 1
    s = int(0.6180339887498949 * n)
    while math.gcd(s, n) != 1:
        s += 1
    return s


def batch(split, b, B, T):
    """Global batch b: sequence j is window ((b B + j) stride) mod the split's windows (gpt2_batch)."""
    nseq = (len(split) - 1) // T
    stride = stride_of(nseq)
    rows = [(b * B + j) % nseq * stride % nseq for j in range(B)]
    x = np.stack([split[w * T:w * T + T] for w in rows])
    y = np.stack([split[w * T + 1:w * T + T + 1] for w in rows])
    return torch.from_numpy(x), torch.from_numpy(y)


def lr_at(a, s):
    """gpt2_lr: linear warmup, then a cosine to lr * lr_min_frac at the last step."""
    lo = a.lr * a.lr_min_frac
    if s < a.warmup:
        return a.lr * (s + 1) / a.warmup
    if a.steps - 1 <= a.warmup:
        return a.lr
    ratio = (s - a.warmup) / (a.steps - 1 - a.warmup)
    return lo + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (a.lr - lo)


def make_model(a):
    cfg = GPT2Config(vocab_size=a.vocab, n_positions=a.seq, n_embd=a.channels, n_layer=a.layers,
                     n_head=a.heads, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                     layer_norm_epsilon=1e-5, activation_function='gelu_new',
                     bos_token_id=0, eos_token_id=0, tie_word_embeddings=True)
    torch.manual_seed(a.seed)
    m = GPT2LMHeadModel(cfg).float()
    m.eval()  # no dropout anywhere (they are 0 anyway)
    return m


def hf_params(m):
    """name -> tensor for every parameter the C example registers (lm_head is wte: tied)."""
    return {k: v for k, v in m.state_dict().items()
            if k.startswith('transformer.') and not k.endswith('.attn.bias')
            and not k.endswith('.attn.masked_bias')}


def loss_of(m, x, y):
    logits = m(x).logits
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1)), logits


def round_to(t, dtype):
    return t.to(dtype).float()


def train_torch(a, init_path, train, mixed=None):
    """PyTorch's run: AdamW (decay on 2-D weights), clipping, the schedule. mixed = torch.bfloat16
    or torch.float16 emulates zero's mixed precision: the forward sees the params rounded to
    that dtype, the gradients (times the loss scale) are rounded to it, the fp32 master and
    AdamW are as in fp32. Returns per-step losses, grad norms and condition numbers K."""
    m = make_model(a)
    m.load_state_dict(load_file(init_path), strict=False)
    params = dict(m.named_parameters())
    decay = [p for n, p in params.items() if p.dim() >= 2]
    nodecay = [p for n, p in params.items() if p.dim() < 2]
    opt = torch.optim.AdamW([{'params': decay, 'weight_decay': WD},
                             {'params': nodecay, 'weight_decay': 0.0}],
                            lr=a.lr, betas=(BETA1, BETA2), eps=EPS, foreach=False)
    master = {n: p.detach().clone() for n, p in params.items()}
    # fp16: the engine's dynamic loss scaler with its defaults (docs/optimizer.md): initial
    # 2^16, window 1000, hysteresis 2, factor 2; an overflow skips the step
    scale = 65536.0 if mixed == torch.float16 else 1.0
    hyst, last_over, skipped = 2, -1, 0
    losses, norms, conds = [], [], []
    for s in range(a.steps):
        for g in opt.param_groups:
            g['lr'] = lr_at(a, s)
        if mixed is not None:
            with torch.no_grad():
                for n, p in params.items():
                    p.copy_(round_to(master[n], mixed))
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for k in range(a.accum):
            x, y = batch(train, s * a.accum + k, a.batch, a.seq)
            loss, _ = loss_of(m, x, y)
            (loss * scale / a.accum).backward()
            total += loss.item() / a.accum
        with torch.no_grad():
            cond = sum(float((p * p.grad).abs().sum()) for p in params.values()) / scale / total
            overflow = False
            if mixed is not None:
                for n, p in params.items():  # gradients in the param dtype, then unscaled
                    p.grad.copy_(round_to(p.grad, mixed) / scale)
                    overflow = overflow or not bool(torch.isfinite(p.grad).all())
                    p.copy_(master[n])
        if overflow:  # skipped: nothing updated; the scaler shrinks after 'hysteresis' overflows
            if hyst == 1:
                scale = max(scale / 2, 1.0)
            else:
                hyst -= 1
            last_over, skipped, norm = s, skipped + 1, float('nan')
        else:
            stable = s - last_over - 1
            if stable > 0 and stable % 1000 == 0:
                hyst, scale = 2, scale * 2
            norm = torch.nn.utils.clip_grad_norm_(list(params.values()), a.clip)
            opt.step()
        if mixed is not None:
            with torch.no_grad():
                for n, p in params.items():
                    master[n].copy_(p)
        losses.append(total)
        norms.append(float(norm))
        conds.append(cond)
    if mixed is not None:
        with torch.no_grad():
            for n, p in params.items():
                p.copy_(master[n])
    train_torch.skipped = skipped
    return losses, norms, conds, m


class Checks:
    def __init__(self):
        self.passed = self.failed = self.skipped = 0

    def check(self, name, ok, detail):
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}", flush=True)
        if ok:
            self.passed += 1
        else:
            self.failed += 1

    def skip(self, name, why):
        print(f"skip {name}: {why}", flush=True)
        self.skipped += 1


def run_c(a, exe, work, tag, extra, launcher=()):
    log = os.path.join(work, f'{tag}.csv')
    cmd = list(launcher) + [exe, '--layers', a.layers, '--heads', a.heads, '--channels', a.channels,
                            '--seq', a.seq, '--vocab', a.vocab, '--batch', a.batch, '--steps', a.steps,
                            '--accum', a.accum, '--lr', a.lr, '--lr-min-frac', a.lr_min_frac,
                            '--warmup', a.warmup, '--clip', a.clip, '--data', a.data,
                            '--val-every', 0, '--val-batches', a.val_batches, '--sample', 0,
                            '--log', log] + list(extra)
    cmd = [str(c) for c in cmd]
    t0 = time.time()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        print(p.stdout)
        raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}")
    rows = [l.split(',') for l in open(log).read().split('\n')[1:] if l]
    out = {'loss': {int(r[0]): float(r[1]) for r in rows}, 'raw': {int(r[0]): r[1] for r in rows},
           'stdout': p.stdout, 'seconds': time.time() - t0}
    for line in p.stdout.splitlines():
        if line.startswith('params checksum: '):
            out['checksum'] = line.split(': ')[1]
        if line.startswith('val loss: '):
            out['val'] = float(line.split(': ')[1])
        if ' step(s) skipped' in line:
            out['skipped'] = int(line.split(' step(s) skipped')[0].split()[-1])
    return out


def max_rel(c_losses, ref, steps):
    return max(abs(c_losses[s] - ref[s]) / abs(ref[s]) for s in steps)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--exe', default='build/train_gpt2')
    ap.add_argument('--mpi-exe', default='build/train_gpt2_mpi')
    ap.add_argument('--ckpt-tool', default='build/zero-ckpt')
    ap.add_argument('--mpirun', default='mpirun')
    ap.add_argument('--work', default='build/gpt2-ref')
    ap.add_argument('--data', default='/usr/share/common-licenses')
    ap.add_argument('--quick', action='store_true', help='the CI subset')
    ap.add_argument('--layers', type=int, default=2)
    ap.add_argument('--heads', type=int, default=4)
    ap.add_argument('--channels', type=int, default=64)
    ap.add_argument('--seq', type=int, default=32)
    ap.add_argument('--vocab', type=int, default=256)
    ap.add_argument('--batch', type=int, default=8)
    ap.add_argument('--steps', type=int, default=100)
    ap.add_argument('--accum', type=int, default=1)
    ap.add_argument('--lr', type=float, default=1e-3)
    ap.add_argument('--lr-min-frac', type=float, default=0.1)
    ap.add_argument('--warmup', type=int, default=10)
    ap.add_argument('--clip', type=float, default=1.0)
    ap.add_argument('--val-batches', type=int, default=4)
    ap.add_argument('--seed', type=int, default=1234)
    ap.add_argument('--curves', default='', help='also write every loss curve here (CSV) for tools/plot_loss.py')
    a = ap.parse_args()
    torch.set_num_threads(1)  # one core, as the C example at 1 rank (2 threads contend on a shared 2-core machine)
    torch.use_deterministic_algorithms(True)
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    ck = Checks()
    train, val = corpus_tokens(a.data, a.vocab)
    steps = range(a.steps)

    # ---- the reference ----------------------------------------------------------------------
    model = make_model(a)
    init = os.path.join(a.work, 'init.safetensors')
    save_file({k: v.contiguous() for k, v in hf_params(model).items()}, init, metadata={'format': 'pt'})
    t0 = time.time()
    ref, ref_norms, ref_cond, ref_model = train_torch(a, init, train)
    torch_s = time.time() - t0
    print(f"PyTorch fp32: {a.steps} steps in {torch_s:.1f} s; loss {ref[0]:.6f} -> {ref[-1]:.6f}", flush=True)
    curves = {'pytorch fp32': ref}

    # ---- forward: step-0 loss and logits ------------------------------------------------------
    logits_path = os.path.join(a.work, 'logits.bin')
    c1 = run_c(a, a.exe, a.work, 'r1s0', ['--stage', 0, '--ranks', 1, '--init', init, '--dump-logits', logits_path])
    x, y = batch(train, 0, a.batch, a.seq)
    with torch.no_grad():
        m0 = make_model(a)
        m0.load_state_dict(load_file(init), strict=False)
        l0, logits0 = loss_of(m0, x, y)
    cl = np.fromfile(logits_path, dtype=np.float32).reshape(logits0.shape)
    err = float(np.abs(cl - logits0.numpy()).max() / np.abs(logits0.numpy()).max())
    ck.check('forward: step-0 logits', err <= 1e-5, f'max |diff| / max |ref| = {err:.2e} (<= 1e-5)')
    e0 = abs(c1['loss'][0] - ref[0]) / ref[0]  # before any update (the mean of the step's micro-batches)
    ck.check('forward: step-0 loss', e0 <= 1e-5, f'{c1["loss"][0]:.9f} vs {ref[0]:.9f}, rel {e0:.2e} (<= 1e-5)')

    # ---- fp32: 100 steps --------------------------------------------------------------------
    e = max_rel(c1['loss'], ref, steps)
    ck.check('fp32 1 rank stage 0', e <= 1e-4, f'max rel diff over {a.steps} steps {e:.2e} (<= 1e-4), {c1["seconds"]:.1f} s')
    curves['zero fp32 1 rank'] = [c1['loss'][s] for s in steps]
    runs4 = {}
    for st in ([0, 3] if a.quick else [0, 1, 2, 3]):
        runs4[st] = run_c(a, a.exe, a.work, f'r4s{st}', ['--stage', st, '--ranks', 4, '--init', init])
        e = max_rel(runs4[st]['loss'], ref, steps)
        ck.check(f'fp32 4 ranks (threads) stage {st}', e <= 1e-4, f'max rel diff {e:.2e} (<= 1e-4)')
        curves[f'zero fp32 4 ranks stage {st}'] = [runs4[st]['loss'][s] for s in steps]
    same = all(r['checksum'] == runs4[0]['checksum'] and r['raw'] == runs4[0]['raw'] for r in runs4.values())
    ck.check('fp32 4 ranks: stages bit-identical', same,
             f'params checksums {sorted(set(r["checksum"] for r in runs4.values()))}')
    mpi_ok = shutil.which(a.mpirun) and os.path.exists(a.mpi_exe)
    if mpi_ok:
        os.environ.update(OMPI_ALLOW_RUN_AS_ROOT='1', OMPI_ALLOW_RUN_AS_ROOT_CONFIRM='1')
        env_launch = [a.mpirun, '--oversubscribe', '--bind-to', 'none', '-np', '4']
        cm = run_c(a, a.mpi_exe, a.work, 'mpi4s3', ['--stage', 3, '--init', init], launcher=env_launch)
        e = max_rel(cm['loss'], ref, steps)
        ck.check('fp32 mpirun -np 4 stage 3', e <= 1e-4, f'max rel diff {e:.2e} (<= 1e-4)')
        ck.check('fp32 mpirun = threads bit for bit', cm['checksum'] == runs4[3]['checksum'] and cm['raw'] == runs4[3]['raw'],
                 f'checksum {cm["checksum"]} vs {runs4[3]["checksum"]}')
    else:
        ck.skip('fp32 mpirun -np 4', f'{a.mpirun} or {a.mpi_exe} not found (make mpi)')

    # ---- bf16 and fp16 against PyTorch's emulation of the same mixed precision -----------------
    for name, dt, u in (('bf16', torch.bfloat16, 2.0 ** -8), ('f16', torch.float16, 2.0 ** -11)):
        if a.quick and name == 'f16':
            ck.skip('f16', '--quick')
            continue
        emu, _, cond, _ = train_torch(a, init, train, mixed=dt)
        cm = run_c(a, a.exe, a.work, f'r1{name}', ['--stage', 0, '--ranks', 1, '--init', init, '--dtype', name])
        bound = [2 * u * cond[s] * emu[s] + 1e-4 * emu[s] for s in steps]
        worst = max(abs(cm['loss'][s] - emu[s]) / bound[s] for s in steps)
        vs32 = max_rel(cm['loss'], ref, steps)
        vsemu = max_rel(cm['loss'], emu, steps)
        ck.check(f'{name}: every step within the derived bound of the emulation',
                 worst <= 1.0 and cm.get('skipped', 0) == train_torch.skipped,
                 f'max |diff| / bound = {worst:.3f} (<= 1; bound at step 0 {bound[0] / emu[0]:.2e} rel, '
                 f'at the last {bound[-1] / emu[-1]:.2e} rel); max rel diff vs the emulation {vsemu:.2e}, '
                 f'vs PyTorch fp32 {vs32:.2e}; '
                 f'{cm.get("skipped", 0)} step(s) skipped (the emulation: {train_torch.skipped})')
        curves[f'zero {name} 1 rank'] = [cm['loss'][s] for s in steps]
        curves[f'pytorch {name} emulation'] = emu

    # ---- export: zero-ckpt export -> GPT2LMHeadModel, val loss ---------------------------------
    ckdir = os.path.join(a.work, 'ckpt-final')
    ce = run_c(a, a.exe, a.work, 'export', ['--stage', 2, '--ranks', 2, '--init', init, '--save', ckdir])
    st_path = os.path.join(a.work, 'export.safetensors')
    subprocess.run([a.ckpt_tool, 'export', ckdir, st_path], check=True, stdout=subprocess.DEVNULL)
    hf = make_model(a)
    missing, unexpected = hf.load_state_dict(load_file(st_path), strict=False)
    missing = [k for k in missing if k != 'lm_head.weight' and not k.endswith('.attn.bias')]
    with torch.no_grad():
        vl = sum(float(loss_of(hf, *batch(val, v, a.batch, a.seq))[0]) for v in range(a.val_batches)) / a.val_batches
    ev = abs(vl - ce['val']) / ce['val']
    ck.check('export: loads into GPT2LMHeadModel, val loss', not missing and not unexpected and ev <= 1e-5,
             f'{vl:.9f} vs C {ce["val"]:.9f}, rel {ev:.2e} (<= 1e-5); missing {missing}, unexpected {unexpected}')

    # ---- resume: save at 50, resume to 100 = straight, bit for bit -----------------------------
    half = a.steps // 2
    for tag, save_args, resume_args, straight in (
            ('1 rank stage 0', ['--stage', 0, '--ranks', 1], ['--stage', 0, '--ranks', 1], c1),
            ('4 ranks, saved at stage 1, resumed at stage 3', ['--stage', 1, '--ranks', 4], ['--stage', 3, '--ranks', 4],
             runs4.get(3))):
        d = os.path.join(a.work, 'ckpt-' + tag.split(',')[0].replace(' ', '-'))
        run_c(a, a.exe, a.work, 'save', save_args + ['--init', init, '--save', d, '--stop-at', half])
        cr = run_c(a, a.exe, a.work, 'resume', resume_args + ['--resume', d])
        same = cr['checksum'] == straight['checksum'] and all(cr['raw'][s] == straight['raw'][s] for s in range(half, a.steps))
        ck.check(f'resume: {tag}', same, f'steps {half}..{a.steps - 1} and params checksum {cr["checksum"]} vs {straight["checksum"]}')

    if a.curves:
        with open(a.curves, 'w') as f:
            names = list(curves)
            f.write('step,' + ','.join(names) + '\n')
            for s in steps:
                f.write(f'{s},' + ','.join(f'{curves[n][s]:.9g}' for n in names) + '\n')
    print(f"{ck.passed} passed, {ck.failed} failed, {ck.skipped} skipped")
    return 1 if ck.failed else 0


if __name__ == '__main__':
    sys.exit(main())
