#!/bin/sh
# GPT-2 example bench (make bench): tokens/s of build/train_gpt2 at 1 rank against PyTorch on
# the CPU (one thread each) on the same model and batch, measured in the same run (a ratio),
# then the per-step breakdown at stages 0-3 on 4 ranks (threads): model compute, gathers,
# gradient reductions, optimizer step (rank 0's wall time in each; with more ranks than
# cores a gather or reduction also waits for the peers' compute).
# PYTHON: a Python with torch and transformers (tools/torch_venv.sh); without it the ratio is
# skipped. GPT2_BENCH: the model flags (default: the demo's model, 30 steps).
set -e
CFG=${GPT2_BENCH:-"--layers 4 --heads 4 --channels 64 --seq 64 --vocab 256 --batch 8 --steps 30"}
PY=${PYTHON:-python3}
c=$(build/train_gpt2 $CFG --stage 0 --ranks 1 --sample 0 --val-every 0 | sed -n 's/.*; \([0-9]*\) tokens\/s$/\1/p')
echo "GPT-2 ($CFG): zero, 1 rank, stage 0: $c tokens/s"
if $PY -c 'import torch, transformers' >/dev/null 2>&1; then
  t=$($PY bench/torch_gpt2.py $CFG | sed -n 's/^TORCH_TOKENS_PER_S //p')
  echo "GPT-2: PyTorch $($PY -c 'import torch; print(torch.__version__)') CPU, 1 thread: $t tokens/s; zero / PyTorch = $(awk "BEGIN { printf \"%.2f\", $c / $t }")"
else
  echo "GPT-2: PyTorch ratio skipped: $PY has no torch (make bench PYTHON=DIR/bin/python, tools/torch_venv.sh DIR)"
fi
for st in 0 1 2 3; do
  printf 'stage %s, 4 ranks: ' "$st"
  build/train_gpt2 $CFG --stage $st --ranks 4 --sample 0 --val-every 0 | sed -n 's/^per step (rank 0): //p'
done
