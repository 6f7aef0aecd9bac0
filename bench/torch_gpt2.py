#!/usr/bin/env python3
"""Tokens per second of PyTorch (CPU, --threads N, default 1) training Hugging Face's GPT2LMHeadModel with
AdamW, the same model and batch as build/train_gpt2 at 1 rank (bench/gpt2.sh runs both).

    bench/torch_gpt2.py --layers L --heads H --channels C --seq T --vocab V --batch B --steps S [--threads N]

Random tokens; the first two steps are warmup. Prints "TORCH_TOKENS_PER_S <x>" (wall clock) and
"TORCH_TOKENS_PER_CPU_S <x>" (the process's CPU seconds, every thread's: the measure a loaded machine
disturbs least at one thread).
"""
import argparse
import time

import torch
import torch.nn.functional as F
import transformers
from transformers import GPT2Config, GPT2LMHeadModel

transformers.logging.set_verbosity_error()

ap = argparse.ArgumentParser()
for k, v in (('layers', 4), ('heads', 4), ('channels', 64), ('seq', 64), ('vocab', 256), ('batch', 8), ('steps', 30)):
    ap.add_argument('--' + k, type=int, default=v)
ap.add_argument('--threads', type=int, default=1)
a = ap.parse_args()
torch.set_num_threads(a.threads)
torch.manual_seed(0)
m = GPT2LMHeadModel(GPT2Config(vocab_size=a.vocab, n_positions=a.seq, n_embd=a.channels, n_layer=a.layers,
                               n_head=a.heads, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                               bos_token_id=0, eos_token_id=0))
decay = [p for p in m.parameters() if p.dim() >= 2]
nodecay = [p for p in m.parameters() if p.dim() < 2]
opt = torch.optim.AdamW([{'params': decay, 'weight_decay': 0.1}, {'params': nodecay, 'weight_decay': 0.0}],
                        lr=1e-3, betas=(0.9, 0.95))
x = torch.randint(0, a.vocab, (a.batch, a.seq + 1))
for s in range(a.steps + 2):
    if s == 2:
        t0, c0 = time.time(), time.process_time()
    opt.zero_grad(set_to_none=True)
    logits = m(x[:, :-1]).logits
    F.cross_entropy(logits.reshape(-1, a.vocab), x[:, 1:].reshape(-1)).backward()
    torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
    opt.step()
t1, c1 = time.time(), time.process_time()
print(f"TORCH_TOKENS_PER_S {a.steps * a.batch * a.seq / (t1 - t0):.0f}")
print(f"TORCH_TOKENS_PER_CPU_S {a.steps * a.batch * a.seq / (c1 - c0):.0f}")
