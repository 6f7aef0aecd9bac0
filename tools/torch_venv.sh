#!/usr/bin/env bash
# tools/torch_venv.sh DIR - a Python venv with torch (CPU use), transformers, safetensors,
# numpy and matplotlib for make test-gpt2 and tools/plot_loss.py.
#
# PyPI's Linux torch wheel is built for CUDA and by default pulls ~3 GB of nvidia-* wheels.
# This installs the torch wheel without its dependencies, plus the four CUDA libraries a
# system CUDA 13 toolkit lacks (cuFile, cuSPARSELt, NVSHMEM, a newer NCCL): torch then loads
# the toolkit's cuBLAS/cuDNN from the system and runs on the CPU (about 2.4 GB, ~1.5 min).
# Without a system CUDA 13 it falls back to the full install.
set -euo pipefail
DIR=${1:?usage: tools/torch_venv.sh DIR}
PY=${PYTHON3:-python3}
TORCH=torch==2.15.0
ok() { "$DIR/bin/python" -c 'import torch, transformers, safetensors, numpy, matplotlib' >/dev/null 2>&1; }
if [ -x "$DIR/bin/python" ] && ok; then echo "torch_venv: $DIR is ready"; exit 0; fi
"$PY" -m venv "$DIR"
"$DIR/bin/pip" install -q --no-deps "$TORCH" nvidia-cufile==1.20.0.107 nvidia-cusparselt-cu13==0.8.1 \
    nvidia-nvshmem-cu13==3.7.2 nvidia-nccl-cu13==2.30.7
"$DIR/bin/pip" install -q filelock typing-extensions sympy networkx jinja2 fsspec numpy safetensors \
    transformers==5.24.0 matplotlib
if ! "$DIR/bin/python" -c 'import torch' >/dev/null 2>&1; then
    echo "torch_venv: torch does not load against this machine's CUDA libraries; installing its dependencies"
    "$DIR/bin/pip" install -q "$TORCH"
fi
ok && echo "torch_venv: $DIR ready ($(du -sh "$DIR" | cut -f1))"
