#!/bin/sh
# GPT-2 example bench (make bench): tokens/s of build/train_gpt2 at 1 rank against PyTorch on
# the CPU (one thread each) on the same model and batch, measured in the same run (a ratio),
# then the per-step breakdown at stages 0-3 on 4 ranks (threads): model compute, gathers,
# gradient reductions, optimizer step (rank 0's wall time in each; with more ranks than
# cores a gather or reduction also waits for the peers' compute).
# PYTHON: a Python with torch and transformers (tools/torch_venv.sh); without it the ratio is
# skipped. GPT2_BENCH: the model flags (default: the demo's model, 30 steps).
set -e
rm -f build/gpt2-bench-c.txt build/gpt2-bench-t.txt
CFG=${GPT2_BENCH:-"--layers 4 --heads 4 --channels 64 --seq 64 --vocab 256 --batch 8 --steps 30"}
PY=${PYTHON:-python3}
# the best of 3 runs each, alternating (the machine is shared: the best is the least disturbed)
best() { awk 'BEGIN { m = 0 } { if ($1 > m) m = $1 } END { print m }'; }
HAVE_TORCH=0; $PY -c 'import torch, transformers' >/dev/null 2>&1 && HAVE_TORCH=1
for i in 1 2 3; do
  build/train_gpt2 $CFG --stage 0 --ranks 1 --sample 0 --val-every 0 | sed -n 's/.*; \([0-9]*\) tokens\/s$/\1/p' >> build/gpt2-bench-c.txt
  [ $HAVE_TORCH = 1 ] && $PY bench/torch_gpt2.py $CFG | sed -n 's/^TORCH_TOKENS_PER_S //p' >> build/gpt2-bench-t.txt
done
c=$(best < build/gpt2-bench-c.txt)
echo "GPT-2 ($CFG): zero, 1 rank, stage 0: $c tokens/s (best of 3)"
if [ $HAVE_TORCH = 1 ]; then
  t=$(best < build/gpt2-bench-t.txt)
  echo "GPT-2: PyTorch $($PY -c 'import torch; print(torch.__version__)') CPU, 1 thread: $t tokens/s (best of 3); zero / PyTorch = $(awk "BEGIN { printf \"%.2f\", $c / $t }")"
else
  echo "GPT-2: PyTorch ratio skipped: $PY has no torch (make bench PYTHON=DIR/bin/python, tools/torch_venv.sh DIR)"
fi
for st in 0 1 2 3; do
  printf 'stage %s, 4 ranks: ' "$st"
  build/train_gpt2 $CFG --stage $st --ranks 4 --sample 0 --val-every 0 | sed -n 's/^per step (rank 0): //p'
done
