#!/usr/bin/env bash
# The CPU reference run documented in docs/reference-run.md: accuracy and speed per runtime, the
# CPU peer, the papers' protocol tables and the load sweeps. Run it on an otherwise idle machine:
#   bash benchmarks/reference_run.sh            (after `make install`; takes about 15 minutes)
set -euo pipefail
cd "$(dirname "$0")/.."
. .venv/bin/activate
DATA=${DATA:-../shared/data}
OUT=${OUT:-docs/reference-run}
PORT=${PORT:-8011}
URL="http://127.0.0.1:$PORT"
mkdir -p "$OUT"
declare -A DATASET=([span-conll03]=conll03 [span-genia]=genia)

declare -A RUNTIMES=([span-conll03]="eager torchscript onnx onnx-int8" [span-genia]="eager onnx")
for model in span-conll03 span-genia; do
  for runtime in ${RUNTIMES[$model]}; do
    flags="--runtime ${runtime%-int8}"; [[ $runtime == onnx-int8 ]] && flags="$flags --int8"
    echo "eval $model $runtime" >&2
    nerserve eval "$model" --data "$DATA/${DATASET[$model]}" --split test --json $flags > "$OUT/eval-$model-$runtime.json"
  done
done
echo "CPU peer" >&2
python benchmarks/cpu_peer.py --model span-conll03 --data "$DATA/conll03" --json > "$OUT/cpu-peer.json"

serve() {  # serve with extra flags in the background, wait until ready
  nerserve serve --port "$PORT" "$@" > "$OUT/server.log" 2>&1 &
  SERVER=$!
  for _ in $(seq 600); do curl -fs "$URL/health/ready" > /dev/null && return 0; sleep 1; done
  echo "server did not become ready" >&2; return 1
}
stop() { kill -TERM "$SERVER"; wait "$SERVER" || true; }

serve
for model in span-conll03 span-genia; do
  for table in nag setgen; do
    echo "protocol $table $model" >&2
    python -m nerserve.loadtest protocol --table "$table" --models "$model" --data "$DATA/${DATASET[$model]}" --url "$URL" \
      --max-seconds 30 --json > "$OUT/protocol-$table-$model.json"
  done
done
python -m nerserve.loadtest run --model span-conll03 --data "$DATA/conll03" --mode closed --concurrency 1,4,16,64 \
  --duration 10 --url "$URL" --out "$OUT/closed"
python -m nerserve.loadtest run --model span-conll03 --data "$DATA/conll03" --mode open --rate sweep --sweep 10:320:6 \
  --duration 10 --slo-p99-ms 130 --url "$URL" --out "$OUT/open"
stop

serve --max-batch-size 1
python -m nerserve.loadtest run --model span-conll03 --data "$DATA/conll03" --mode closed --concurrency 64 \
  --duration 10 --url "$URL" --out "$OUT/closed-batch1"
stop
echo "written to $OUT" >&2
python benchmarks/render_reference.py "$OUT" > /dev/null
