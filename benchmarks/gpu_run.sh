#!/usr/bin/env bash
# GPU figures (performance issue) for every architecture's CoNLL-2003 model, on a CUDA machine:
#   offline  sentences/s at batch 1/8/32/128, arrival order and length-sorted, and the peak GPU
#            memory torch allocated (benchmarks/batching_ceiling.py --device cuda);
#   served   closed loop, one test sentence per request, at concurrency 1/16/64/256 with the
#            dynamic batcher, and at 64 with --max-batch-size 1 (the batching gain); p50/p99 are in
#            each summary.json; the serving process's GPU memory from nvidia-smi.
# RUNTIME=eager runs the torch modules on the GPU (no export needed); torchscript runs the exported
# TorchScript graphs on CUDA. Needs the service's Python packages and a GPU:
#   OUT=docs/reference-run/gpu bash benchmarks/gpu_run.sh
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
DATA=${DATA:-../shared/data}
OUT=${OUT:-docs/reference-run/gpu}
RUNTIME=${RUNTIME:-eager}
MODELS=${MODELS:-span-conll03 nag-conll03 diffusion-conll03 setgen-conll03 bartner-conll03}
LIMIT=${LIMIT:-256}
DURATION=${DURATION:-5}
PORT=${PORT:-8013}
URL="http://127.0.0.1:$PORT"
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.csv"

serve() {
  $PY -m nerserve serve --port "$PORT" --models "$1" --runtime "$RUNTIME" --device cuda "${@:2}" > "$OUT/server-$1.log" 2>&1 &
  SERVER=$!
  for _ in $(seq 300); do curl -fs "$URL/health/ready" > /dev/null && return 0; sleep 1; done
  echo "server for $1 did not become ready" >&2; return 1
}
stop() { kill -TERM "$SERVER"; wait "$SERVER" || true; }

for model in $MODELS; do
  $PY benchmarks/batching_ceiling.py --model "$model" --data "$DATA/conll03" --runtime "$RUNTIME" --device cuda \
    --sizes 1,8,32,128 --limit "$LIMIT" --json > "$OUT/offline-$model.json"
  if serve "$model"; then
    $PY -m nerserve.loadtest run --model "$model" --data "$DATA/conll03" --mode closed --concurrency 1,16,64,256 \
      --duration "$DURATION" --url "$URL" --out "$OUT/served-$model" > /dev/null
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv > "$OUT/served-$model/gpu-memory.csv"
    stop
  fi
  if serve "$model" --max-batch-size 1; then
    $PY -m nerserve.loadtest run --model "$model" --data "$DATA/conll03" --mode closed --concurrency 64 \
      --duration "$DURATION" --url "$URL" --out "$OUT/served-batch1-$model" > /dev/null
    stop
  fi
done
echo "written to $OUT" >&2
