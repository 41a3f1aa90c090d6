#!/usr/bin/env bash
# DiffusionNER figures of docs/notes.md: exports with parity (both formats), test F1 through the
# exported ONNX graphs, and the paper's Figure 3 as a table (F1 and sentences/s for steps ×
# K on GENIA test, ONNX). Run on an otherwise idle machine after `make install`:
#   bash benchmarks/diffusion_run.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. .venv/bin/activate
DATA=${DATA:-../shared/data}
OUT=${OUT:-docs/reference-run}
mkdir -p "$OUT"
declare -A DATASET=([diffusion-conll03]=conll03 [diffusion-genia]=genia)
for model in diffusion-conll03 diffusion-genia; do
  for runtime in onnx torchscript; do
    nerserve export "$model" --format "$runtime" --json > "$OUT/export-$model-$runtime.json"
  done
  nerserve eval "$model" --data "$DATA/${DATASET[$model]}" --split test --json --runtime onnx > "$OUT/eval-$model-onnx.json"
done
python benchmarks/diffusion_steps.py --model diffusion-genia --data "$DATA/genia" --steps 1,2,5,10 \
  --proposals 20,60,100 --json > "$OUT/diffusion-steps-genia.json"
echo "written to $OUT" >&2
