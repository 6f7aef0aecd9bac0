#!/usr/bin/env bash
# The Makefile's NCCL search on fake PyPI wheel layouts (no CUDA, no NCCL needed): builds
# site-packages trees in a temporary directory, points PYTHONPATH at them, hides the real
# CUDA and system directories (CUDA_HOME=/nonexistent, NCCL_SEARCH=), and checks what
# `make print-nccl` finds. Ends with a "zt: N passed, N failed, N skipped" line.
set -u
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0 fail=0
fake() { # fake DIR LIBS...: DIR/include/nccl.h and DIR/lib/<each lib>
    mkdir -p "$1/include" "$1/lib"; echo '/* fake */' >"$1/include/nccl.h"; shift_dir=$1; shift
    for l in "$@"; do : >"$shift_dir/lib/$l"; done
}
check() { # check NAME PYTHONPATH WANT_HOME WANT_LIB
    local out home lib
    out=$(PYTHONPATH="$2" make -s --no-print-directory CUDA_HOME=/nonexistent NCCL_SEARCH= print-nccl 2>&1)
    home=$(sed -n 's/^NCCL_HOME=//p' <<<"$out"); lib=$(sed -n 's/^NCCL_LIB=//p' <<<"$out")
    if [ "$home" = "$3" ] && [ "$lib" = "$4" ] &&
       { [ -z "$3" ] || [ "$(sed -n 's/^NCCL_LIBDIR=//p' <<<"$out")" = "$3/lib" ]; }; then
        pass=$((pass + 1)); echo "  ok: $1"
    else
        fail=$((fail + 1)); echo "  FAIL: $1: wanted NCCL_HOME=$3 NCCL_LIB=$4, got:"; echo "$out" | sed 's/^/    /'
    fi
}
sp1=$tmp/a/site-packages; fake "$sp1/nvidia/nccl" libnccl.so.2
check "nvidia/nccl (nvidia-nccl-cu12 wheel)" "$sp1" "$sp1/nvidia/nccl" "-l:libnccl.so.2"
sp2=$tmp/b/site-packages; fake "$sp2/nvidia/cu13" libnccl.so.2
mkdir -p "$sp2/nvidia/cu13/include/cuda"  # other CUDA 13 wheels share the tree
check "nvidia/cu13 (CUDA 13 wheel)" "$sp2" "$sp2/nvidia/cu13" "-l:libnccl.so.2"
sp3=$tmp/c/site-packages; fake "$sp3/nvidia/cu12" libnccl.so.2; fake "$sp3/nvidia/cu13" libnccl.so.2
check "cu13 preferred over cu12" "$sp3" "$sp3/nvidia/cu13" "-l:libnccl.so.2"
sp4=$tmp/d/site-packages; fake "$sp4/nvidia/cu13" libnccl.so.2 libnccl.so
check "a libnccl.so next to it: plain -lnccl" "$sp4" "$sp4/nvidia/cu13" "-lnccl"
sp5=$tmp/e/site-packages; mkdir -p "$sp5/nvidia/cu13/lib"; : >"$sp5/nvidia/cu13/lib/libnccl.so.2"
check "no nccl.h: not taken" "$sp5" "" "-lnccl"
check "first sys.path entry wins" "$sp1:$sp2" "$sp1/nvidia/nccl" "-l:libnccl.so.2"
out=$(PYTHONPATH="$sp2" make -s --no-print-directory NCCL_HOME=/opt/mine CUDA_HOME=/nonexistent print-nccl)
if grep -qx "NCCL_HOME=/opt/mine" <<<"$out"; then pass=$((pass + 1)); echo "  ok: NCCL_HOME given wins"
else fail=$((fail + 1)); echo "  FAIL: NCCL_HOME given: $out"; fi
echo "zt: $pass passed, $fail failed, 0 skipped"
[ "$fail" -eq 0 ]
