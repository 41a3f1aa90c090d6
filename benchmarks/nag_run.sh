#!/usr/bin/env bash
# NAG-NER figures of docs/notes.md: accuracy through the exported graphs (parity figures in each
# export.json), and the NAG-NER protocol (one fixed batch of 4 test sentences, concurrency 1)
# for nag next to span on this machine. Run on an otherwise idle machine after `make install`:
#   bash benchmarks/nag_run.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. .venv/bin/activate
DATA=${DATA:-../shared/data}
OUT=${OUT:-docs/reference-run}
PORT=${PORT:-8012}
URL="http://127.0.0.1:$PORT"
mkdir -p "$OUT"
declare -A DATASET=([nag-cadec]=cadec [nag-conll03]=conll03 [nag-genia]=genia)
for model in nag-cadec nag-conll03 nag-genia; do
  for runtime in onnx torchscript; do
    nerserve export "$model" --format "$runtime" --json > "$OUT/export-$model-$runtime.json"
  done
  nerserve eval "$model" --data "$DATA/${DATASET[$model]}" --split test --json --runtime onnx > "$OUT/eval-$model-onnx.json"
done

nerserve serve --port "$PORT" --models nag-conll03,span-conll03,nag-genia,span-genia,nag-cadec > "$OUT/server-nag.log" 2>&1 &
SERVER=$!
trap 'kill -TERM $SERVER; wait $SERVER || true' EXIT
for _ in $(seq 900); do curl -fs "$URL/health/ready" > /dev/null && break; sleep 1; done
python -m nerserve.loadtest protocol --table nag --models span-conll03,nag-conll03 --data "$DATA/conll03" --url "$URL" \
  --max-seconds 30 --json > "$OUT/protocol-nag-nag-conll03.json"
python -m nerserve.loadtest protocol --table nag --models span-genia,nag-genia --data "$DATA/genia" --url "$URL" \
  --max-seconds 30 --json > "$OUT/protocol-nag-nag-genia.json"
python -m nerserve.loadtest protocol --table nag --models nag-cadec --data "$DATA/cadec" --url "$URL" \
  --max-seconds 30 --json > "$OUT/protocol-nag-nag-cadec.json"
echo "written to $OUT" >&2
