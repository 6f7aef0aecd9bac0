#!/usr/bin/env python3
"""Fine-tuning a Hugging Face GPT-2 with the GPT example (examples/train_gpt2.c) against
PyTorch + transformers (issue 27).

A random GPT2LMHeadModel (L 2, H 4, C 64, n_positions 64, V 256) is saved three ways:
save_pretrained (GPT2LMHeadModel's keys, transformer.h.0...), the bare GPT2Model's
save_pretrained (the hub's prefix-less layout, h.0...), and save_pretrained sharded into
several files (model.safetensors.index.json). The C example fine-tunes it (--init DIR) for
50 steps (T 32, batch 8) on llm.c .bin tokens (--data train.bin --val-data val.bin) with
AdamW flags away from their defaults, in two splits:

  A  --freeze wpe,h.0 --lr-embed 0.5     wte (and the tied head) at half the lr: frozen
                                         tensors and a per-tensor lr together
  B  --freeze wte,wpe,h.0 --lr-embed 0.5 the issue's split (the embeddings' lr is moot)

and PyTorch trains the same model with requires_grad = False on the same tensors and the
same parameter groups (decay on 2-D weights only, the embeddings' group at lr x 0.5), the
same batches, schedule and clipping. Checks:

  loss      every step's loss within 1e-4 relative of PyTorch's: A at stage 0 on 1 rank
            (from the plain directory) and at stage 3 on 4 ranks (from the sharded one);
            B at stage 3 on 4 ranks (from the prefix-less one)
  frozen    the exported frozen tensors bit-equal to the initial ones
  export    train_gpt2 --export DIR and zero-ckpt export CKPT --hf DIR load with
            GPT2LMHeadModel.from_pretrained (no missing or unexpected keys, lm_head tied to
            wte) and give the C program's val loss within 1e-5 relative; their config.json
            keeps every key of --init's (one the test adds, zero_carry_check, included;
            architectures GPT2LMHeadModel)
  memory    each run's model-state bytes and traffic per rank, measured, equal the formula
            with the frozen elements counted apart (the example's own line)
  refusals  a shape flag that disagrees with config.json is refused naming both values
  dropout   --dropout 0.1 (no frozen tensors, DROP_STEPS steps) against PyTorch applying the
            identical masks: our counter-based hash (examples/gpt2_common.h, gpt2_dropout_keep)
            computed here in numpy, multiplied in by modules that replace HF's three dropouts
            (transformer.drop, attn.resid_dropout, mlp.dropout) and by an eager attention that
            masks the probabilities; every step's loss within 1e-4 relative at stage 0 on 1
            rank and stage 3 on 4 ranks (each rank draws its slice of the global batch's
            masks), and away from the run without dropout (the masks matter)
  tokenize  tools/tokenize.py with a byte-level BPE tokenizer.json built here: the .bin holds
            GPT2TokenizerFast's tokens of each file after <|endoftext|>, decodes back to the
            text, and train_gpt2 trains on it

Ends with "N passed, N failed, N skipped".
"""
import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
import transformers
from transformers import GPT2Config, GPT2LMHeadModel

transformers.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt2_reference import Checks, batch, lr_at, stride_of  # noqa: E402  (the same data order and schedule)

BETA1, BETA2, EPS, WD, LR_EMBED = 0.85, 0.99, 1e-6, 0.05, 0.5
SPLITS = {'A': ['wpe', 'h.0'], 'B': ['wte', 'wpe', 'h.0']}
DROPOUT, DROP_STEPS, DROP_SEED = 0.1, 20, 1337

# ---- the example's dropout masks (examples/gpt2_common.h, docs/gpt2.md "Dropout") ----
M64, GOLDEN = (1 << 64) - 1, 0x9e3779b97f4a7c15
SITE_EMBD, SITE_ATTN, SITE_ATTN_RESID, SITE_MLP_RESID = 0, 1, 2, 3


def mix64(z):
    """splitmix64's finalizer on a Python int or a numpy uint64 array (wrapping mod 2^64)."""
    if isinstance(z, int):
        z = ((z ^ (z >> 30)) * 0xbf58476d1ce4e5b9) & M64
        z = ((z ^ (z >> 27)) * 0x94d049bb133111eb) & M64
        return z ^ (z >> 31)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xbf58476d1ce4e5b9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94d049bb133111eb)
    return z ^ (z >> np.uint64(31))


def drop_mask(seed, step, micro, layer, site, shape, p):
    """The multiplier of every element of a tensor of the global batch: float32(1 / (1 - p))
    where u(i) = mix(K + (i + 1) G) >> 40 >= round(p 2^24), else 0, i the row-major index."""
    key = mix64(mix64(mix64(mix64(mix64(seed) ^ step) ^ micro) ^ layer) ^ site)
    i = np.arange(int(np.prod(shape)), dtype=np.uint64)
    with np.errstate(over='ignore'):
        u = mix64(np.uint64(key) + (i + np.uint64(1)) * np.uint64(GOLDEN)) >> np.uint64(40)
    keep = u >= np.uint64(int(p * 16777216.0 + 0.5))
    return torch.from_numpy(np.where(keep, np.float32(1.0 / (1.0 - p)), np.float32(0.0)).reshape(shape))


class Masks:
    """The step being trained (accumulation 1: micro-step 0) for the hooked modules."""
    step = 0
    p = 0.0


class MaskDrop(torch.nn.Module):
    """Replaces an nn.Dropout: multiplies by the example's mask of (layer, site)."""

    def __init__(self, layer, site):
        super().__init__()
        self.layer, self.site = layer, site

    def forward(self, x):
        return x * drop_mask(DROP_SEED, Masks.step, 0, self.layer, self.site, tuple(x.shape), Masks.p)


def masked_eager_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """HF's eager attention with the softmax multiplied by the example's mask ([B, H, T, T])."""
    w = torch.matmul(query, key.transpose(-1, -2)) * scaling
    if attention_mask is not None:
        w = w + attention_mask
    w = torch.softmax(w, dim=-1)
    w = w * drop_mask(DROP_SEED, Masks.step, 0, module.layer_idx, SITE_ATTN, tuple(w.shape), Masks.p)
    return torch.matmul(w, value).transpose(1, 2), w


def hook_dropout(m, p):
    """Puts the example's masks where GPT-2 has dropout."""
    import transformers.models.gpt2.modeling_gpt2 as mg
    mg.eager_attention_forward = masked_eager_attention  # looked up at call time
    Masks.p = p
    m.transformer.drop = MaskDrop(0, SITE_EMBD)
    for l, blk in enumerate(m.transformer.h):
        blk.attn.resid_dropout = MaskDrop(l, SITE_ATTN_RESID)
        blk.mlp.dropout = MaskDrop(l, SITE_MLP_RESID)


def write_bin(path, tokens):
    """llm.c's token file: 256 int32 header (magic 20240520, version 1, count), uint16 tokens."""
    hdr = np.zeros(256, dtype=np.int32)
    hdr[0], hdr[1], hdr[2] = 20240520, 1, len(tokens)
    with open(path, 'wb') as f:
        f.write(hdr.tobytes())
        f.write(np.asarray(tokens, dtype=np.uint16).tobytes())


def frozen_names(items, layers):
    out = set()
    for it in items:
        if it in ('wte', 'wpe'):
            out.add(f'transformer.{it}.weight')
        elif it.startswith('h.'):
            out.add(f'transformer.{it}.')
    return out


def is_frozen(name, fz):
    return any(name == f or (f.endswith('.') and name.startswith(f)) for f in fz)


def train_torch(a, init_dir, train, split, dropout=None, steps=None):
    """PyTorch's fine-tuning: frozen tensors requires_grad = False; groups (decay, no decay) x
    (embeddings at lr x LR_EMBED, the rest); AdamW with the test's flags; clipping over the
    trained params; the example's schedule. dropout P: the example's masks (hook_dropout),
    eager attention. Per-step losses."""
    steps = steps or a.steps
    if dropout is None:
        m = GPT2LMHeadModel.from_pretrained(init_dir).float()
    else:
        m = GPT2LMHeadModel.from_pretrained(init_dir, attn_implementation='eager').float()
        hook_dropout(m, dropout)
    m.eval()
    fz = frozen_names(SPLITS[split] if split else [], a.layers)
    params = dict(m.named_parameters())  # lm_head.weight is wte (tied: one parameter)
    for n, p in params.items():
        p.requires_grad_(not is_frozen(n, fz))
    groups = []
    for emb in (True, False):
        for dec in (True, False):
            ps = [p for n, p in params.items() if p.requires_grad and (p.dim() >= 2) == dec
                  and (n in ('transformer.wte.weight', 'transformer.wpe.weight')) == emb]
            if ps:
                groups.append({'params': ps, 'weight_decay': WD if dec else 0.0, 'mul': LR_EMBED if emb else 1.0})
    opt = torch.optim.AdamW(groups, lr=a.lr, betas=(BETA1, BETA2), eps=EPS, foreach=False)
    trained = [p for p in params.values() if p.requires_grad]
    losses = []
    for s in range(steps):
        Masks.step = s
        for g in opt.param_groups:
            g['lr'] = lr_at(a, s) * g['mul']
        opt.zero_grad(set_to_none=True)
        x, y = batch(train, s, a.batch, a.seq)
        logits = m(x).logits
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trained, a.clip)
        opt.step()
        losses.append(loss.item())
    return losses, m


def run_c(a, work, tag, init, extra, steps=None):
    log = os.path.join(work, f'{tag}.csv')
    cmd = [a.exe, '--init', init, '--seq', a.seq, '--batch', a.batch, '--steps', steps or a.steps, '--lr', a.lr,
           '--lr-min-frac', a.lr_min_frac, '--warmup', a.warmup, '--clip', a.clip,
           '--data', os.path.join(work, 'train.bin'), '--val-data', os.path.join(work, 'val.bin'),
           '--val-every', 0, '--val-batches', a.val_batches, '--sample', 0, '--log', log,
           '--beta1', BETA1, '--beta2', BETA2, '--eps', EPS, '--weight-decay', WD, '--lr-embed', LR_EMBED] + extra
    cmd = [str(c) for c in cmd]
    t0 = time.time()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        print(p.stdout)
        raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}")
    rows = [l.split(',') for l in open(log).read().split('\n')[1:] if l]
    out = {'loss': [float(r[1]) for r in rows], 'stdout': p.stdout, 'seconds': time.time() - t0}
    for line in p.stdout.splitlines():
        if line.startswith('val loss: '):
            out['val'] = float(line.split(': ')[1])
    return out


def hf_val_loss(model_dir, val, a):
    m, info = GPT2LMHeadModel.from_pretrained(model_dir, output_loading_info=True)
    m = m.float().eval()
    tied = m.lm_head.weight.data_ptr() == m.transformer.wte.weight.data_ptr()
    with torch.no_grad():
        vl = 0.0
        for v in range(a.val_batches):
            x, y = batch(val, v, a.batch, a.seq)
            logits = m(x).logits
            vl += float(F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1)))
    return vl / a.val_batches, info, tied


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--exe', default='build/train_gpt2')
    ap.add_argument('--ckpt-tool', default='build/zero-ckpt')
    ap.add_argument('--work', default='build/gpt2-finetune')
    ap.add_argument('--tokenize-tool', default='tools/tokenize.py')
    ap.add_argument('--data', default='/usr/share/common-licenses')
    ap.add_argument('--layers', type=int, default=2)
    ap.add_argument('--heads', type=int, default=4)
    ap.add_argument('--channels', type=int, default=64)
    ap.add_argument('--positions', type=int, default=64)
    ap.add_argument('--seq', type=int, default=32)
    ap.add_argument('--vocab', type=int, default=256)
    ap.add_argument('--batch', type=int, default=8)
    ap.add_argument('--steps', type=int, default=50)
    ap.add_argument('--lr', type=float, default=1e-3)
    ap.add_argument('--lr-min-frac', type=float, default=0.1)
    ap.add_argument('--warmup', type=int, default=5)
    ap.add_argument('--clip', type=float, default=1.0)
    ap.add_argument('--val-batches', type=int, default=4)
    ap.add_argument('--seed', type=int, default=4321)
    a = ap.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    ck = Checks()
    t_start = time.time()

    # the corpus as llm.c .bin files: the first 90% of the bytes to train on, the rest to validate
    names = sorted((n for n in os.listdir(a.data) if not n.startswith('.') and os.path.isfile(os.path.join(a.data, n))),
                   key=lambda s: s.encode())
    raw = b''.join(open(os.path.join(a.data, n), 'rb').read() for n in names)
    tok = np.frombuffer(raw, dtype=np.uint8).astype(np.int64)
    cut = len(tok) * 9 // 10
    train, val = tok[:cut], tok[cut:]
    write_bin(os.path.join(a.work, 'train.bin'), train)
    write_bin(os.path.join(a.work, 'val.bin'), val)

    # the pretrained model, three ways
    cfg = GPT2Config(vocab_size=a.vocab, n_positions=a.positions, n_embd=a.channels, n_layer=a.layers, n_head=a.heads,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, layer_norm_epsilon=1e-5,
                     activation_function='gelu_new', bos_token_id=None, eos_token_id=None, tie_word_embeddings=True,
                     zero_carry_check={'nested': [1, 'x'], 'note': 'a key zero does not know'})
    torch.manual_seed(a.seed)
    model = GPT2LMHeadModel(cfg).float()
    dirs = {k: os.path.join(a.work, k) for k in ('plain', 'prefixless', 'sharded')}
    model.save_pretrained(dirs['plain'])
    model.transformer.save_pretrained(dirs['prefixless'])
    model.save_pretrained(dirs['sharded'], max_shard_size='100KB')
    shards = [n for n in os.listdir(dirs['sharded']) if n.endswith('.safetensors')]
    keys = list(load_file(os.path.join(dirs['prefixless'], 'model.safetensors')))
    print(f"checkpoints: {dirs['plain']}; {dirs['prefixless']} (keys like {keys[0]}); {dirs['sharded']} "
          f"({len(shards)} shards)", flush=True)
    init_sd = {k: v.clone() for k, v in model.state_dict().items()}

    refs = {}
    for split in SPLITS:
        t0 = time.time()
        refs[split], _ = train_torch(a, dirs['plain'], train, split)
        print(f"PyTorch split {split} (--freeze {','.join(SPLITS[split])}): {a.steps} steps in {time.time() - t0:.1f} s; "
              f"loss {refs[split][0]:.6f} -> {refs[split][-1]:.6f}", flush=True)

    runs = [('A', 0, 1, 'plain'), ('A', 3, 4, 'sharded'), ('B', 3, 4, 'prefixless')]
    for split, stage, ranks, src in runs:
        tag = f'{split}-s{stage}r{ranks}'
        exp = os.path.join(a.work, f'export-{tag}')
        ckdir = os.path.join(a.work, f'ckpt-{tag}')
        c = run_c(a, a.work, tag, dirs[src], ['--stage', stage, '--ranks', ranks, '--freeze', ','.join(SPLITS[split]),
                                               '--export', exp, '--save', ckdir])
        ref = refs[split]
        e = max(abs(c['loss'][s] - ref[s]) / abs(ref[s]) for s in range(a.steps))
        ck.check(f'split {split} stage {stage} {ranks} rank(s) from the {src} checkpoint', len(c['loss']) == a.steps and e <= 1e-4,
                 f'max rel diff over {a.steps} steps {e:.2e} (<= 1e-4), {c["seconds"]:.1f} s')
        mem = re.search(r'model states per rank: (\d+) B measured on the device, (\d+) B by formula.*'
                        r'traffic per step: (\d+) B measured, (\d+) B by formula', c['stdout'])
        ck.check(f'split {split} stage {stage}: model states and traffic per rank = the frozen-aware formula',
                 mem is not None and mem.group(1) == mem.group(2) and mem.group(3) == mem.group(4),
                 f'states {mem.group(1)} B measured, {mem.group(2)} B by formula; traffic {mem.group(3)} B measured, '
                 f'{mem.group(4)} B by formula' if mem else 'no memory line in the output')
        out = load_file(os.path.join(exp, 'model.safetensors'))
        fz = frozen_names(SPLITS[split], a.layers)
        frozen = [k for k in init_sd if is_frozen(k, fz)]
        same = all(torch.equal(out[k], init_sd[k]) for k in frozen)
        moved = [k for k in out if k not in frozen and not torch.equal(out[k], init_sd[k])]
        ck.check(f'split {split} stage {stage}: frozen tensors bit-unchanged', same and len(moved) == len(out) - len(frozen),
                 f'{len(frozen)} frozen tensors equal to the initial ones; {len(moved)} of {len(out) - len(frozen)} '
                 'trained ones moved')
        hf = os.path.join(a.work, f'hf-{tag}')
        p = subprocess.run([a.ckpt_tool, 'export', ckdir, '--hf', hf], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True)
        for d, how in ((exp, 'train_gpt2 --export'), (hf, 'zero-ckpt export --hf')):
            if how.startswith('zero-ckpt') and p.returncode != 0:
                ck.check(f'split {split} stage {stage}: {how}', False, p.stdout)
                continue
            vl, info, tied = hf_val_loss(d, val, a)
            ev = abs(vl - c['val']) / c['val']
            ok = not info['missing_keys'] and not info['unexpected_keys'] and not info['mismatched_keys'] and tied
            # config.json: every key of --init's carried through (architectures: the export's class)
            icfg, ecfg = (json.load(open(os.path.join(x, 'config.json'))) for x in (dirs[src], d))
            lost = [k for k in icfg if k != 'architectures' and ecfg.get(k, '<missing>') != icfg[k]]
            ck.check(f'split {split} stage {stage}: {how} carries --init\'s config.json through',
                     not lost and ecfg.get('architectures') == ['GPT2LMHeadModel'] and 'zero_carry_check' in icfg,
                     f'{len(icfg)} keys of {src}/config.json, {len(lost)} lost or changed {lost[:5]}; architectures '
                     f'{ecfg.get("architectures")}')
            ck.check(f'split {split} stage {stage}: {how} loads with from_pretrained', ok and ev <= 1e-5,
                     f'val loss {vl:.9f} vs C {c["val"]:.9f}, rel {ev:.2e} (<= 1e-5); missing {sorted(info["missing_keys"])}, '
                     f'unexpected {sorted(info["unexpected_keys"])}, head tied {tied}')

    # dropout: the example's masks in PyTorch (hooked HF modules), no frozen tensors, a short
    # schedule (lr_at reads a.steps: the C runs get --steps DROP_STEPS too)
    full_steps, a.steps = a.steps, DROP_STEPS
    t0 = time.time()
    ref_d, _ = train_torch(a, dirs['plain'], train, '', dropout=DROPOUT)
    ref_0, _ = train_torch(a, dirs['plain'], train, '')
    print(f"PyTorch --dropout {DROPOUT} with the example's masks: {DROP_STEPS} steps in {time.time() - t0:.1f} s "
          f"(and without dropout); loss {ref_d[0]:.6f} -> {ref_d[-1]:.6f}", flush=True)
    away = max(abs(ref_d[s] - ref_0[s]) / abs(ref_0[s]) for s in range(DROP_STEPS))
    for stage, ranks in ((0, 1), (3, 4)):
        c = run_c(a, a.work, f'dropout-s{stage}r{ranks}', dirs['plain'],
                  ['--stage', stage, '--ranks', ranks, '--dropout', DROPOUT, '--seed', DROP_SEED])
        e = max(abs(c['loss'][s] - ref_d[s]) / abs(ref_d[s]) for s in range(DROP_STEPS))
        ck.check(f'--dropout {DROPOUT} stage {stage} {ranks} rank(s): PyTorch with the same masks',
                 len(c['loss']) == DROP_STEPS and e <= 1e-4 and away > 1e-3,
                 f'max rel diff over {DROP_STEPS} steps {e:.2e} (<= 1e-4); without dropout the loss moves by '
                 f'up to {away:.2e} (> 1e-3); {c["seconds"]:.1f} s')
    a.steps = full_steps

    # a shape flag that disagrees with config.json is refused, naming both values
    p = subprocess.run([a.exe, '--init', dirs['plain'], '--layers', str(a.layers + 1), '--steps', '1'],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    want = f"says n_layer = {a.layers}, --layers says {a.layers + 1}"
    ck.check('refused: --layers against config.json', p.returncode == 2 and want in p.stdout, p.stdout.strip()[-200:])
    # tools/tokenize.py with a byte-level BPE tokenizer.json built here (nothing downloads):
    # the tokens are HF's GPT-2 tokenizer's on the same file, each document after <|endoftext|>
    from tokenizers import Tokenizer, models, trainers, pre_tokenizers, decoders
    from transformers import GPT2TokenizerFast
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.train([os.path.join(a.data, names[0])], trainers.BpeTrainer(
        vocab_size=400, special_tokens=['<|endoftext|>'], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tdir = os.path.join(a.work, 'tokenizer')
    os.makedirs(tdir)
    tk.save(os.path.join(tdir, 'tokenizer.json'))
    docs = [os.path.join(a.data, n) for n in names[1:3]]
    tbin = os.path.join(a.work, 'tokens.bin')
    p = subprocess.run([sys.executable, a.tokenize_tool, '--tokenizer', tdir, '--out', tbin] + docs,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    hf_tok = GPT2TokenizerFast(tokenizer_file=os.path.join(tdir, 'tokenizer.json'))
    eot = hf_tok.convert_tokens_to_ids('<|endoftext|>')
    want = []
    texts = [open(d, encoding='utf-8', newline='').read() for d in docs]
    for t in texts:
        want += [eot] + hf_tok(t)['input_ids']
    got = []
    if p.returncode == 0:
        hdr = np.fromfile(tbin, dtype=np.int32, count=256)
        got = np.fromfile(tbin, dtype=np.uint16, offset=1024).tolist()
        got = got if hdr[0] == 20240520 and hdr[1] == 1 and hdr[2] == len(got) else []
    back = hf_tok.decode(got).split('<|endoftext|>')[1:] if got else []
    c = subprocess.run([a.exe, '--data', tbin, '--vocab', '400', '--layers', '1', '--channels', '32', '--seq', '32',
                        '--steps', '2', '--stage', '0', '--ranks', '1', '--sample', '8', '--tokenizer', tdir],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors='replace')
    ck.check('tools/tokenize.py: GPT-2 tokenizer tokens in llm.c .bin, trained on', got == want and back == texts and
             c.returncode == 0, f'{len(got)} tokens ({len(want)} from GPT2TokenizerFast), decoded back '
             f'{"equal" if back == texts else "DIFFERENT"}; train_gpt2 --data exit {c.returncode}; {p.stdout.strip()}')
    # and back through the C program's vocabulary (--tokenizer): the file's exact bytes, each
    # document after <|endoftext|>; the sample's prompt (the first 16 validation tokens) is
    # what GPT2TokenizerFast decodes of them
    d = subprocess.run([a.exe, '--tokenizer', os.path.join(tdir, 'tokenizer.json'), '--decode', tbin],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    orig = b''.join(b'<|endoftext|>' + open(f, 'rb').read() for f in docs)
    prompt = hf_tok.decode(got[len(got) - len(got) // 10:][:16]) if got else None
    sample = c.stdout.split('sample:\n', 1)[1] if 'sample:\n' in c.stdout else ''
    ck.check('train_gpt2 --tokenizer: decodes tools/tokenize.py\'s tokens back to the text', d.returncode == 0 and
             d.stdout == orig and prompt is not None and sample.startswith(prompt),
             f'--decode: {len(d.stdout)} bytes, the documents\' {len(orig)} with their separators, '
             f'{"equal" if d.stdout == orig else "DIFFERENT"} (exit {d.returncode} {d.stderr.decode()[-200:]}); '
             f'the sample starts with the prompt {prompt!r}: {sample.startswith(prompt) if prompt else False}')

    print(f"gpt2_finetune: {time.time() - t_start:.1f} s")
    print(f"{ck.passed} passed, {ck.failed} failed, {ck.skipped} skipped")
    return 1 if ck.failed else 0


if __name__ == '__main__':
    sys.exit(main())
