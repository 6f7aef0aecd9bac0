#!/usr/bin/env bash
# The CUDA examples under the harness (make test-cuda-sim runs it; prints one zt summary
# line). $1: the harness's build directory (build/cudasim, or -asan / -tsan), holding
# train_gpt2 and train_gpu built from examples/*.cu; build/train_gpt2 is the CPU example.
#
# - examples/train_gpt2.cu at a tiny shape (1 layer, 2 heads, 16 channels, seq 8, bytes):
#   the demo (stages 0-3 in turn, which must end "identical losses and bit-identical
#   parameters", exit 0) for f32, bf16 and f16 at --ranks 1 and 2; one process over the NCCL
#   comm (rank 0 of 1, stage 3); CPU and NVMe optimizer offload at stage 3, 2 ranks, whose
#   losses and params checksum must equal the plain run's bit for bit;
# - the same flags against the CPU example (build/train_gpt2, --ranks 2, stage 0, 20 steps):
#   every step's loss within the bound of docs/gpt2_cuda.md ("Under the harness"), also with
#   --lr-embed and the AdamW flags away from their defaults (which must change the run),
#   and --sample's text equal to the CPU example's; --freeze and --dropout 0.1 refused;
# - 4 ranks as 2 nodes x 2: hpZ, MiCS, qgZ int8, --offload-ratio and the delayed update
#   bf16 optimizer states reach the engine and give the CPU example's losses; hpZ and the
#   ratio the plain bits;
# - examples/train_gpu.cu (one process: its ranks are a launcher's processes, which the
#   harness cannot join) at stages 0-3, f16 and bf16: exit 0 and the same printed losses
#   at every stage.
set -u
cd "$(dirname "$0")/../.."
D=${1:-build/cudasim}
passed=0; failed=0; skipped=0
tmp=$(mktemp -d "${TMPDIR:-/tmp}/zt-cudasim-ex.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
ok() { echo "ok   $1"; passed=$((passed + 1)); }
bad() { echo "FAIL $1"; [ -n "${2:-}" ] && tail -n 8 "$2"; failed=$((failed + 1)); }
G="--layers 1 --heads 2 --channels 16 --seq 8 --batch 2 --steps 3 --val-batches 1 --sample 0 --data LICENSE --seed 7"
sum_of() { sed -n 's/^params checksum: \([0-9a-f]\{16\}\)$/\1/p' "$1" | tail -n 1; }

# the demo: stages 0-3 bit-identical
for dt in f32 bf16 f16; do
  for n in 1 2; do
    out="$tmp/demo_$dt$n.out"
    # shellcheck disable=SC2086
    if "$D/train_gpt2" $G --dtype $dt --ranks $n > "$out" 2>&1 &&
       grep -q "stages 0-3: identical losses and bit-identical parameters" "$out"; then
      ok "train_gpt2.cu demo $dt --ranks $n: stages 0-3 bit-identical"
    else bad "train_gpt2.cu demo $dt --ranks $n" "$out"; fi
  done
done

# one process over NCCL (no launcher: rank 0 of 1)
# shellcheck disable=SC2086
if env -u RANK -u WORLD_SIZE -u OMPI_COMM_WORLD_RANK -u OMPI_COMM_WORLD_SIZE -u SLURM_PROCID \
     "$D/train_gpt2" $G --stage 3 > "$tmp/nccl.out" 2>&1 && grep -q "NCCL comm" "$tmp/nccl.out"; then
  ok "train_gpt2.cu over NCCL, 1 process, stage 3"
else bad "train_gpt2.cu over NCCL, 1 process" "$tmp/nccl.out"; fi

# offload: the same bits as the plain run
# shellcheck disable=SC2086
"$D/train_gpt2" $G --stage 3 --ranks 2 --dtype bf16 --log "$tmp/plain.csv" > "$tmp/plain.out" 2>&1
for tier in cpu nvme; do
  mkdir -p "$tmp/nvme"
  # shellcheck disable=SC2086
  "$D/train_gpt2" $G --stage 3 --ranks 2 --dtype bf16 --offload-optimizer $tier --nvme-path "$tmp/nvme" \
    --log "$tmp/$tier.csv" > "$tmp/$tier.out" 2>&1
  a=$(sum_of "$tmp/plain.out"); b=$(sum_of "$tmp/$tier.out")
  if [ -n "$a" ] && [ "$a" = "$b" ] && cmp -s "$tmp/plain.csv" "$tmp/$tier.csv"; then
    ok "train_gpt2.cu --offload-optimizer $tier = plain (checksum $a)"
  else bad "train_gpt2.cu --offload-optimizer $tier: '$b' vs plain '$a'" "$tmp/$tier.out"; fi
done

# The comparisons with the CPU example (build/train_gpt2) below: not under ZT_QUICK (the
# sanitizer runs, which run the programs above for memory errors; the plain run compares)
CMP=1
if [ -n "${ZT_QUICK:-}" ]; then
  CMP=""; echo "  skip: ZT_QUICK: the comparisons with the CPU example (the plain run makes them)"; skipped=$((skipped + 1))
elif [ ! -x build/train_gpt2 ]; then
  CMP=""; echo "  skip: build/train_gpt2 not built"; skipped=$((skipped + 1))
fi

# against the CPU example: every step's loss within the documented bound
if [ -n "$CMP" ]; then
  for dt in f32 bf16 f16; do
    tol=1e-5; [ "$dt" != f32 ] && tol=1e-4
    # shellcheck disable=SC2086
    "$D/train_gpt2" $G --steps 20 --stage 0 --ranks 2 --dtype $dt --log "$tmp/g.csv" > "$tmp/g.out" 2>&1
    # shellcheck disable=SC2086
    build/train_gpt2 $G --steps 20 --stage 0 --ranks 2 --dtype $dt --log "$tmp/c.csv" > "$tmp/c.out" 2>&1
    worst=$(paste -d, "$tmp/g.csv" "$tmp/c.csv" | awk -F, -v tol="$tol" '
      NR > 1 { d = $2 - $7; if (d < 0) d = -d; r = d / ($7 < 0 ? -$7 : $7); if (r > w) w = r; n++ }
      END { if (n != 20) print "rows " n; else printf "%.3g%s\n", w, (w <= tol ? "" : " over " tol) }')
    case "$worst" in
      *over*|rows*|"") bad "train_gpt2.cu vs train_gpt2.c, $dt: $worst" "$tmp/g.out" ;;
      *) ok "train_gpt2.cu vs train_gpt2.c, $dt, 20 steps: worst relative loss difference $worst (bound $tol)" ;;
    esac
  done
fi

# fine-tuning flags: --lr-embed (the embeddings' parameter group) and AdamW's settings away
# from their defaults, against the CPU example within the f32 bound; the run without them
# differs (they reached the engine); --freeze and --dropout P > 0 refused with a message
if [ -n "$CMP" ]; then
  F="--lr-embed 0.5 --beta1 0.85 --beta2 0.99 --eps 1e-6 --weight-decay 0.05"
  # shellcheck disable=SC2086
  "$D/train_gpt2" $G $F --steps 20 --stage 3 --ranks 2 --log "$tmp/fg.csv" > "$tmp/fg.out" 2>&1
  # shellcheck disable=SC2086
  build/train_gpt2 $G $F --steps 20 --stage 3 --ranks 2 --log "$tmp/fc.csv" > "$tmp/fc.out" 2>&1
  # shellcheck disable=SC2086
  build/train_gpt2 $G --steps 20 --stage 3 --ranks 2 --log "$tmp/fp.csv" > "$tmp/fp.out" 2>&1
  worst=$(paste -d, "$tmp/fg.csv" "$tmp/fc.csv" "$tmp/fp.csv" | awk -F, '
    NR > 1 { d = $2 - $7; if (d < 0) d = -d; r = d / ($7 < 0 ? -$7 : $7); if (r > w) w = r; n++
             e = $12 - $7; if (e < 0) e = -e; if (e > m) m = e }
    END { if (n != 20) print "rows " n; else printf "%.3g%s\n", w, (w <= 1e-5 && m > 1e-4 ? "" : " over 1e-5, or the same as without the flags") }')
  case "$worst" in
    *over*|rows*|"") bad "train_gpt2.cu $F vs train_gpt2.c: $worst" "$tmp/fg.out" ;;
    *) ok "train_gpt2.cu $F vs train_gpt2.c, stage 3, 20 steps: worst relative loss difference $worst (bound 1e-5)" ;;
  esac
fi
for f in "--freeze wte" "--dropout 0.1"; do
  # shellcheck disable=SC2086
  "$D/train_gpt2" $G $f > "$tmp/ref.out" 2>&1; rc=$?
  if [ "$rc" = 2 ] && grep -q "CPU example" "$tmp/ref.out"; then ok "train_gpt2.cu $f: refused (exit 2), naming the CPU example"
  else bad "train_gpt2.cu $f: exit $rc" "$tmp/ref.out"; fi
done

# beyond one node and adaptive offload, on the device comm (4 ranks as 2 nodes x 2): the
# flags reach the engine (its memory lines or the losses differ from the plain run's; the
# CPU example with the same flags within the f32 bound) and the exact ones keep the plain
# run's bits (hpZ, --offload-ratio); --offload-activations refused
if [ -n "$CMP" ]; then
  H="$G --batch 4 --steps 8 --stage 3 --ranks 4 --ranks-per-node 2"
  # shellcheck disable=SC2086
  "$D/train_gpt2" $H --log "$tmp/hp.csv" > "$tmp/hp.out" 2>&1
  for f in "--hpz-partition-size 2" "--mics-shard-size 2" "--quantized-gradients 8" \
           "--offload-optimizer cpu --offload-ratio 0.5" "--offload-optimizer cpu --delayed-update-after 2" \
           "--optimizer-dtype bf16"; do
    # shellcheck disable=SC2086
    "$D/train_gpt2" $H $f --log "$tmp/hg.csv" > "$tmp/hg.out" 2>&1; g=$?
    # shellcheck disable=SC2086
    build/train_gpt2 $H $f --log "$tmp/hc.csv" > "$tmp/hc.out" 2>&1
    worst=$(paste -d, "$tmp/hg.csv" "$tmp/hc.csv" | awk -F, '
      NR > 1 { d = $2 - $7; if (d < 0) d = -d; r = d / ($7 < 0 ? -$7 : $7); if (r > w) w = r; n++ }
      END { if (n != 8) print "rows " n; else printf "%.3g%s\n", w, (w <= 1e-5 ? "" : " over 1e-5") }')
    same=""
    # it reached the engine: the memory lines or the losses differ from the plain run's
    grep '^rank 0 ' "$tmp/hg.out" > "$tmp/hg.mem"; grep '^rank 0 ' "$tmp/hp.out" > "$tmp/hp.mem"
    if cmp -s "$tmp/hg.mem" "$tmp/hp.mem" && cmp -s "$tmp/hg.csv" "$tmp/hp.csv"; then worst="$worst, not reaching the engine"; fi
    case "$f" in
      --hpz*|*ratio*) if [ "$(sum_of "$tmp/hg.out")" = "$(sum_of "$tmp/hp.out")" ] && cmp -s "$tmp/hg.csv" "$tmp/hp.csv"
                      then same=", the plain run's bits"; else worst="$worst, not the plain run's bits"; fi ;;
    esac
    case "$g $worst" in
      0\ *over*|0\ *rows*|0\ *not*|[1-9]*) bad "train_gpt2.cu $f (exit $g): $worst" "$tmp/hg.out" ;;
      *) ok "train_gpt2.cu 2 x 2 $f: the CPU example's losses within $worst (bound 1e-5)$same" ;;
    esac
  done
fi
# shellcheck disable=SC2086
"$D/train_gpt2" $G --offload-activations cpu > "$tmp/ref.out" 2>&1; rc=$?
if [ "$rc" = 2 ] && grep -q "CPU example" "$tmp/ref.out"; then ok "train_gpt2.cu --offload-activations: refused (exit 2), naming the CPU example"
else bad "train_gpt2.cu --offload-activations: exit $rc" "$tmp/ref.out"; fi

# --sample: each token one forward of a single sequence (B = 1); the text equals the CPU
# example's (the same draws from logits that differ in their last bits only)
if [ -n "$CMP" ]; then
  S="$G --steps 3 --stage 3 --ranks 2 --sample 24"
  # shellcheck disable=SC2086
  "$D/train_gpt2" $S > "$tmp/gs.out" 2>&1; g=$?
  # shellcheck disable=SC2086
  build/train_gpt2 $S > "$tmp/cs.out" 2>&1
  sed -n '/^sample:$/,$p' "$tmp/gs.out" > "$tmp/gs.txt"; sed -n '/^sample:$/,$p' "$tmp/cs.out" > "$tmp/cs.txt"
  if [ "$g" = 0 ] && [ -s "$tmp/gs.txt" ] && cmp -s "$tmp/gs.txt" "$tmp/cs.txt"; then
    ok "train_gpt2.cu --sample 24 = the CPU example's sample"
  else bad "train_gpt2.cu --sample 24 (exit $g)" "$tmp/gs.out"; fi
fi

# train_gpu.cu: stages 0-3, f16 and bf16, one process
if [ ! -x "$D/train_gpu" ]; then
  echo "  skip train_gpu.cu: not built under the harness (make test-cuda-sim says why)"; skipped=$((skipped + 1))
else for dt in f16 bf16; do
  for st in 0 1 2 3; do
    if "$D/train_gpu" --stage $st --steps 4 --dtype $dt --batch 8 --hidden 16 --print 1 > "$tmp/mlp$st.out" 2>&1; then
      grep -E '^ +[0-9]+ \|' "$tmp/mlp$st.out" | cut -d'|' -f1-3 > "$tmp/mlp$st.loss"
    else : > "$tmp/mlp$st.loss"; fi
  done
  if [ -s "$tmp/mlp0.loss" ] && cmp -s "$tmp/mlp0.loss" "$tmp/mlp1.loss" && cmp -s "$tmp/mlp0.loss" "$tmp/mlp2.loss" &&
     cmp -s "$tmp/mlp0.loss" "$tmp/mlp3.loss"; then
    ok "train_gpu.cu $dt stages 0-3: exit 0, the same losses"
  else bad "train_gpu.cu $dt stages 0-3" "$tmp/mlp3.out"; fi
done; fi
echo "zt: $passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
