#!/usr/bin/env bash
# gpu_check.sh's dry run under the GPU machine's releases of the libraries it does not carry
# (transformers, tokenizers, onnx, onnx-ir, onnxscript, safetensors; KINDS.md of the device tool) and
# onnxruntime at onnxruntime-gpu's pin, in a scratch environment, before a lease is spent finding a
# difference between releases, then the CUDA-graph checks the CPU can make under those releases.
# torch stays the CPU wheel on disk and Python this machine's; the GPU-only steps are what the dry
# run cannot reach.
#
#   bash benchmarks/gpu_compat.sh [VENV]    # default /tmp/gpu-compat; OUT=… for the check's files
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-/tmp/gpu-compat}
OUT=${OUT:-build/gpu-compat}
DATA=${DATA:-../shared/data}
# the GPU machine's releases (as its sessions saw them), and ONNX Runtime at the GPU image's pin
GPU_MACHINE=(transformers==5.17.0 tokenizers==0.23.2 onnx==1.23.1 onnx-ir==1.0.0 onnxscript==0.7.2 safetensors==0.8.0
  huggingface-hub==1.33.0 peft aiohttp prometheus-client)
ORT="onnxruntime==$(sed -n 's/^onnxruntime-gpu==//p' constraints/lock.txt)"
# what gpu_bundle.sh carries there, at the lock's pins, and uvloop, which the GPU machine has
mapfile -t CARRIED < <(bash benchmarks/gpu_bundle.sh packages)
CARRIED+=("$(grep -i '^uvloop==' constraints/lock.txt || echo uvloop)")

if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q torch==2.13.0
  "$VENV/bin/pip" install -q "${GPU_MACHINE[@]}" "$ORT"
  "$VENV/bin/pip" install -q --no-deps "${CARRIED[@]}"
  "$VENV/bin/pip" install -q --no-deps -e .
fi
"$VENV/bin/python" -c 'import pytest' 2>/dev/null || "$VENV/bin/pip" install -q pytest
"$VENV/bin/python" -c 'import onnxruntime, transformers, torch; print("onnxruntime", onnxruntime.__version__, "transformers", transformers.__version__, "torch", torch.__version__)'
# graphs exported here by these releases, not taken from build/
rm -rf "$OUT/check"
PY="$VENV/bin/python" NERSERVE_GRAPH_CACHE="$OUT/graphs" OUT="$OUT/check" DATA="$DATA" \
  bash benchmarks/gpu_check.sh --device cpu --quick
if grep -q FAILED "$OUT/check/progress.log"; then
  grep FAILED "$OUT/check/progress.log"
  exit 1
fi
# what the dry run cannot reach of --cuda-graphs: these releases' backbone pass holds nothing a
# capture refuses, and its padding leaves every sentence's states as they are
"$VENV/bin/python" -m pytest -q -p no:cacheprovider tests/test_cuda_graphs.py
