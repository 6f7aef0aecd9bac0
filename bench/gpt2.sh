#!/bin/sh
# GPT-2 example bench (make bench): tokens/s of build/train_gpt2 (stage 0; N ranks = N
# threads) against PyTorch on the CPU (GPT2LMHeadModel + AdamW, torch.set_num_threads(N)) on
# the same model and global batch, measured in the same run (a ratio), at three shapes and
# N = 1 and 2: the demo's model, a 4-layer model of C 256 with GPT-2's vocabulary, and GPT-2
# 124M (sequences of 64). Then the per-step breakdown at stages 0-3 on 4 ranks (threads):
# model compute, gathers, gradient reductions, optimizer step (rank 0's wall time in each;
# with more ranks than cores a gather or reduction also waits for the peers' compute).
# PYTHON: a Python with torch and transformers (tools/torch_venv.sh); without it the ratios
# are skipped. GPT2_BENCH: one model's flags instead of the three (with --steps);
# GPT2_BENCH_REPS: repetitions (default 3; the best of each is kept, runs interleaved: the
# machine is shared, the best is the least disturbed).
set -e
PY=${PYTHON:-python3}
REPS=${GPT2_BENCH_REPS:-3}
DEMO="--layers 4 --heads 4 --channels 64 --seq 64 --vocab 256 --batch 8 --steps 30"
if [ -n "$GPT2_BENCH" ]; then
  set -- "$GPT2_BENCH"
else
  set -- "$DEMO" \
         "--layers 4 --heads 4 --channels 256 --seq 64 --vocab 50257 --batch 8 --steps 8" \
         "--layers 12 --heads 12 --channels 768 --seq 64 --vocab 50257 --batch 4 --steps 4"
fi
HAVE_TORCH=0; $PY -c 'import torch, transformers' >/dev/null 2>&1 && HAVE_TORCH=1
best() { awk 'BEGIN { m = 0 } { if ($1 > m) m = $1 } END { print m }'; }
echo "GPT-2 bench, $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, load average$(uptime | sed 's/.*load average[s]*://')"
[ $HAVE_TORCH = 1 ] && echo "PyTorch $($PY -c 'import torch; print(torch.__version__)') on the CPU" ||
  echo "PyTorch ratios skipped: $PY has no torch (make bench PYTHON=DIR/bin/python, tools/torch_venv.sh DIR)"
echo "| model | threads (ranks) | zero tokens/s | PyTorch tokens/s | zero / PyTorch |"
echo "|---|---|---|---|---|"
for cfg in "$@"; do
  for n in 1 2; do
    rm -f build/gpt2-bench-c.txt build/gpt2-bench-t.txt
    touch build/gpt2-bench-t.txt
    i=0
    while [ $i -lt "$REPS" ]; do
      build/train_gpt2 $cfg --stage 0 --ranks $n --sample 0 --val-every 0 | sed -n 's/.*; \([0-9]*\) tokens\/s$/\1/p' >> build/gpt2-bench-c.txt
      [ $HAVE_TORCH = 1 ] && $PY bench/torch_gpt2.py $cfg --threads $n | sed -n 's/^TORCH_TOKENS_PER_S //p' >> build/gpt2-bench-t.txt
      i=$((i + 1))
    done
    c=$(best < build/gpt2-bench-c.txt)
    t=$(best < build/gpt2-bench-t.txt)
    model=$(echo "$cfg" | sed 's/--layers \([0-9]*\) --heads \([0-9]*\) --channels \([0-9]*\) --seq \([0-9]*\) --vocab \([0-9]*\) --batch \([0-9]*\).*/L\1 H\2 C\3 V\5, B\6 T\4/')
    if [ $HAVE_TORCH = 1 ] && [ "$t" != 0 ]; then
      echo "| $model | $n | $c | $t | **$(awk "BEGIN { printf \"%.2f\", $c / $t }")** |"
    else
      echo "| $model | $n | $c | - | - |"
    fi
  done
done
echo "(best of $REPS each; load average at the end$(uptime | sed 's/.*load average[s]*://'))"
CFG=${GPT2_BENCH:-$DEMO}
for st in 0 1 2 3; do
  printf 'stage %s, 4 ranks: ' "$st"
  build/train_gpt2 $CFG --stage $st --ranks 4 --sample 0 --val-every 0 | sed -n 's/^per step (rank 0): //p'
done
