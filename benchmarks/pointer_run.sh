#!/usr/bin/env bash
# setgen / bartner figures of docs/notes.md: exports with parity (ONNX and TorchScript), test F1
# through the ONNX graphs, and the papers' speed tables on CoNLL-2003 with bartner as the 1× row
# (SetGNER's whole test set in batches of ≤ 800 tokens, NAG-NER's fixed batch of 4), every
# architecture in the same server run. On an otherwise idle machine after `make install`:
#   bash benchmarks/pointer_run.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. .venv/bin/activate
DATA=${DATA:-../shared/data}
OUT=${OUT:-docs/reference-run}
PORT=${PORT:-8013}
URL="http://127.0.0.1:$PORT"
MODELS=${MODELS:-setgen-conll03 bartner-conll03}
mkdir -p "$OUT"
for model in $MODELS; do
  for runtime in onnx torchscript; do
    nerserve export "$model" --format "$runtime" --json > "$OUT/export-$model-$runtime.json"
  done
  nerserve eval "$model" --data "$DATA/conll03" --split test --json --runtime onnx > "$OUT/eval-$model-onnx.json"
done

nerserve serve --port "$PORT" --models span-conll03,nag-conll03,diffusion-conll03,setgen-conll03,bartner-conll03 \
  > "$OUT/server-pointer.log" 2>&1 &
SERVER=$!
trap 'kill -TERM $SERVER; wait $SERVER || true' EXIT
for _ in $(seq 900); do curl -fs "$URL/health/ready" > /dev/null && break; sleep 1; done
ROWS="bartner-conll03,span-conll03,nag-conll03,diffusion-conll03?steps=1,diffusion-conll03?steps=5,setgen-conll03"
for table in setgen nag; do
  python -m nerserve.loadtest protocol --table "$table" --models "$ROWS" --reference bartner-conll03 --data "$DATA/conll03" \
    --url "$URL" --max-seconds 30 --json > "$OUT/protocol-$table-pointer-conll03.json"
done
echo "written to $OUT" >&2
