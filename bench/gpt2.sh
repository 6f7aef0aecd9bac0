#!/bin/sh
# GPT-2 example bench (make bench): tokens/s of build/train_gpt2 (stage 0; N ranks = N
# threads) against PyTorch on the CPU (GPT2LMHeadModel + AdamW, torch.set_num_threads(N)) on
# the same model and global batch, measured in the same run (a ratio), at three shapes and
# N = 1 and 2: the demo's model, a 4-layer model of C 256 with GPT-2's vocabulary, and GPT-2
# 124M (sequences of 64). Then the per-step breakdown at stages 0-3 on 4 ranks (threads):
# model compute, gathers, gradient reductions, optimizer step (rank 0's wall time in each;
# with more ranks than cores a gather or reduction also waits for the peers' compute).
# PYTHON: a Python with torch and transformers (tools/torch_venv.sh); without it the ratios
# are skipped. Each program's first steps are warm-up and not counted; beside the wall-clock ratio
# the table gives the 1-thread ratio of tokens per CPU second, which a shared machine's load
# disturbs far less. GPT2_BENCH: one model's flags instead of the three (with --steps);
# GPT2_BENCH_REPS: repetitions (default 3; the best of each is kept, runs interleaved: the
# machine is shared, the best is the least disturbed). LLMC: a checkout of llm.c; with it the
# table gains llm.c's train_gpt2.c on the same model, batch and threads (bench/llmc_gpt2.sh).
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
LL=0; [ -n "$LLMC" ] && LL=1
best() { awk 'BEGIN { m = 0 } { if ($1 > m) m = $1 } END { print m }'; }
ratio() { case "$1:$2" in *:0|*:|*:-|0:*|:*|-:*) echo - ;; *) awk "BEGIN { printf \"%.2f\", $1 / $2 }" ;; esac; }
echo "GPT-2 bench, $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, load average$(uptime | sed 's/.*load average[s]*://')"
[ $HAVE_TORCH = 1 ] && echo "PyTorch $($PY -c 'import torch; print(torch.__version__)') on the CPU" ||
  echo "PyTorch ratios skipped: $PY has no torch (make bench PYTHON=DIR/bin/python, tools/torch_venv.sh DIR)"
[ $LL = 1 ] && echo "llm.c: $LLMC ($(git -C "$LLMC" rev-parse --short HEAD 2>/dev/null || echo 'not a git checkout')), -Ofast -march=native -fopenmp, OMP_NUM_THREADS = threads"
echo "tokens/s from the second step on (zero, llm.c) or the third (PyTorch); CPU: tokens per CPU second of the"
echo "process, at one thread only (a loaded machine delays a process but barely changes its CPU time)"
H="| model | threads (ranks) | zero tokens/s | PyTorch tokens/s | zero / PyTorch | zero / PyTorch, CPU |"
S="|---|---|---|---|---|---|"
[ $LL = 1 ] && H="$H llm.c tokens/s | zero / llm.c |" && S="$S---|---|"
echo "$H"; echo "$S"
for cfg in "$@"; do
  for n in 1 2; do
    for f in c cc t tc l; do : > build/gpt2-bench-$f.txt; done
    i=0
    while [ $i -lt "$REPS" ]; do
      build/train_gpt2 $cfg --stage 0 --ranks $n --sample 0 --val-every 0 > build/gpt2-bench-out.txt
      sed -n 's/^from the second step on: \([0-9]*\) tokens\/s, \([0-9]*\) tokens per CPU.*/\1 \2/p' \
        build/gpt2-bench-out.txt > build/gpt2-bench-w.txt
      cut -d' ' -f1 build/gpt2-bench-w.txt >> build/gpt2-bench-c.txt
      cut -d' ' -f2 build/gpt2-bench-w.txt >> build/gpt2-bench-cc.txt
      if [ $HAVE_TORCH = 1 ]; then
        $PY bench/torch_gpt2.py $cfg --threads $n > build/gpt2-bench-out.txt
        sed -n 's/^TORCH_TOKENS_PER_S //p' build/gpt2-bench-out.txt >> build/gpt2-bench-t.txt
        sed -n 's/^TORCH_TOKENS_PER_CPU_S //p' build/gpt2-bench-out.txt >> build/gpt2-bench-tc.txt
      fi
      [ $LL = 1 ] && sh bench/llmc_gpt2.sh $cfg --threads $n | sed -n 's/^LLMC_TOKENS_PER_S //p' >> build/gpt2-bench-l.txt
      i=$((i + 1))
    done
    c=$(best < build/gpt2-bench-c.txt) cc=$(best < build/gpt2-bench-cc.txt)
    t=$(best < build/gpt2-bench-t.txt) tc=$(best < build/gpt2-bench-tc.txt) l=$(best < build/gpt2-bench-l.txt)
    cpu=-; [ $n = 1 ] && cpu=$(ratio "$cc" "$tc")
    model=$(echo "$cfg" | sed 's/--layers \([0-9]*\) --heads \([0-9]*\) --channels \([0-9]*\) --seq \([0-9]*\) --vocab \([0-9]*\) --batch \([0-9]*\).*/L\1 H\2 C\3 V\5, B\6 T\4/')
    [ "$t" = 0 ] && t=-
    row="| $model | $n | $c | $t | **$(ratio "$c" "$t")** | $cpu |"
    [ $LL = 1 ] && { [ "$l" = 0 ] && l=-; row="$row $l | **$(ratio "$c" "$l")** |"; }
    echo "$row"
  done
done
echo "(best of $REPS each; load average at the end$(uptime | sed 's/.*load average[s]*://'))"
CFG=${GPT2_BENCH:-$DEMO}
for st in 0 1 2 3; do
  printf 'stage %s, 4 ranks: ' "$st"
  build/train_gpt2 $CFG --stage $st --ranks 4 --sample 0 --val-every 0 | sed -n 's/^per step (rank 0): //p'
done
