#!/bin/sh
# bench/llmc_gpt2.sh - tokens per second of llm.c's CPU trainer (train_gpt2.c) on one of
# bench/gpt2.sh's models, for the zero / llm.c column (bench/gpt2.sh runs it when LLMC is set).
#
#     LLMC=DIR bench/llmc_gpt2.sh --layers L --heads H --channels C --seq T --vocab V --batch B --steps S --threads N
#
# DIR is a checkout of https://github.com/karpathy/llm.c (not in this repository, and not
# reachable from CI: bring your own). llm.c's main() trains a fixed batch (B 4, T 64) from
# the files gpt2_124M.bin and dev/data/tinyshakespeare/*.bin for 40 steps, with a validation
# pass every 10 and a 64-token generation every 20. This script builds a copy of that file
# with B, T and the step count set, validation and generation off (sed; nothing else of it
# changes), with the flags llm.c's Makefile uses (-Ofast -march=native -fopenmp), and runs
# it in build/llmc/ on a checkpoint of this model's shape (random weights, llm.c's format:
# a 256 x int32 header, magic 20240326 version 3, then fp32 parameters; the vocabulary
# padded to a multiple of 128 as llm.c pads it) and random tokens. Threads: OMP_NUM_THREADS.
# It times each step with llm.c's own clock ("took X ms") and skips step 0 (warm-up).
# Prints "LLMC_TOKENS_PER_S <x>"; needs PYTHON (default python3) with numpy for the files.
set -e
[ -n "$LLMC" ] && [ -f "$LLMC/train_gpt2.c" ] || { echo "llmc_gpt2.sh: set LLMC to a checkout of llm.c" >&2; exit 2; }
PY=${PYTHON:-python3}
L=4 H=4 C=64 T=64 V=256 B=8 S=10 N=1
while [ $# -gt 0 ]; do
  case "$1" in
    --layers) L=$2 ;; --heads) H=$2 ;; --channels) C=$2 ;; --seq) T=$2 ;; --vocab) V=$2 ;;
    --batch) B=$2 ;; --steps) S=$2 ;; --threads) N=$2 ;;
    *) echo "llmc_gpt2.sh: unknown flag $1" >&2; exit 2 ;;
  esac
  shift 2
done
W=build/llmc/L${L}H${H}C${C}T${T}V${V}B${B}S${S}
mkdir -p "$W/dev/data/tinyshakespeare"
SRC="$W/train_gpt2.c"
if [ ! -x "$W/train_gpt2" ]; then
  sed -e "s/int B = 4;/int B = $B;/" -e "s/int T = 64;/int T = $T;/" \
      -e "s/step <= 40;/step <= $S;/" -e 's/if (step % 10 == 0) {/if (0) {/' \
      -e 's/if (step > 0 \&\& step % 20 == 0) {/if (0) {/' "$LLMC/train_gpt2.c" > "$SRC"
  # every edit must have applied: a newer llm.c that moved one would be timed wrongly
  for want in "int B = $B;" "int T = $T;" "step <= $S;"; do
    grep -q "$want" "$SRC" || { echo "llmc_gpt2.sh: could not set '$want' in $LLMC/train_gpt2.c" >&2; exit 2; }
  done
  [ "$(grep -c 'if (0) {' "$SRC")" -ge 2 ] || { echo "llmc_gpt2.sh: could not turn off validation and generation" >&2; exit 2; }
  ${CC:-cc} -Ofast -march=native -fopenmp -DOMP -Wno-unused-result -I"$LLMC" "$SRC" -o "$W/train_gpt2" -lm -lgomp
fi
if [ ! -f "$W/gpt2_124M.bin" ]; then
  "$PY" - "$W" "$L" "$H" "$C" "$T" "$V" <<'EOF'
import sys
import numpy as np
w, L, H, C, T, V = sys.argv[1], *map(int, sys.argv[2:])
Vp = (V + 127) // 128 * 128
hdr = np.zeros(256, np.int32)
hdr[:8] = [20240326, 3, T, V, L, H, C, Vp]
# llm.c's tensors in its order: wte, wpe, ln1 w b, qkv w b, attproj w b, ln2 w b, fc w b, fcproj w b, lnf w b
sizes = [Vp * C, T * C, L * C, L * C, L * 3 * C * C, L * 3 * C, L * C * C, L * C, L * C, L * C,
         L * 4 * C * C, L * 4 * C, L * C * 4 * C, L * C, C, C]
ones = {2, 8, 14}  # the layer norms' weights
rng = np.random.default_rng(0)
with open(w + '/gpt2_124M.bin', 'wb') as f:
    f.write(hdr.tobytes())
    for i, n in enumerate(sizes):
        a = np.ones(n, np.float32) if i in ones else (rng.standard_normal(n) * 0.02).astype(np.float32)
        f.write(a.tobytes())
for name in ('train', 'val'):
    ntok = 1 << 16
    th = np.zeros(256, np.int32)
    th[:3] = [20240520, 1, ntok]
    with open(w + '/dev/data/tinyshakespeare/tiny_shakespeare_' + name + '.bin', 'wb') as f:
        f.write(th.tobytes())
        f.write(rng.integers(0, V, ntok).astype(np.uint16).tobytes())
EOF
fi
cd "$W"
OMP_NUM_THREADS=$N ./train_gpt2 | awk -v bt=$((B * T)) '
  /^step [0-9]+: train loss .* \(took [0-9.]+ ms\)/ {
    if ($2 != "0:") { ms += $7 + 0; n++ } }
  END { if (n == 0 || ms <= 0) exit 1; printf "LLMC_TOKENS_PER_S %.0f\n", n * bt / (ms / 1000) }'
