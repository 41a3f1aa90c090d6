#!/usr/bin/env bash
# The service issue's two throughput figures, with the load generator on its own core:
#   batching gain = sentences/s at concurrency 64 (one CoNLL test sentence per request) with the
#                   default batcher ÷ the same with --max-batch-size 1;
#   service overhead = end-to-end sentences/s ÷ the graph-time sentences/s of the same batches
#                   (server_graph_sentences_per_second in summary.json);
# and what batching can gain at all on this machine, offline (benchmarks/batching_ceiling.py).
# Server on core 0 (one graph thread), client on core 1. Run on an otherwise idle machine:
#   bash benchmarks/batching_run.sh
# The GPU-like layout (the graph thread has a core of its own, as it has its device on a GPU node;
# HTTP, tokenisation and decoding run beside it on the other core, shared with the client):
#   SERVER_CORE=0,1 CLIENT_CORE=1 CEILING=0 OUT=docs/reference-run/batching-2cores bash benchmarks/batching_run.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. .venv/bin/activate
DATA=${DATA:-../shared/data}
OUT=${OUT:-docs/reference-run/batching}
PORT=${PORT:-8013}
URL="http://127.0.0.1:$PORT"
SERVER_CORE=${SERVER_CORE:-0}
CLIENT_CORE=${CLIENT_CORE:-1}
mkdir -p "$OUT"

if [ "${CEILING:-1}" = 1 ]; then
  taskset -c "$SERVER_CORE" python benchmarks/batching_ceiling.py --model span-conll03 --data "$DATA/conll03" \
    --threads 1 --limit 600 --json > "$OUT/ceiling.json"
fi

serve() {
  taskset -c "$SERVER_CORE" nerserve serve --port "$PORT" --models span-conll03 --threads 1 "$@" > "$OUT/server.log" 2>&1 &
  SERVER=$!
  for _ in $(seq 600); do curl -fs "$URL/health/ready" > /dev/null && return 0; sleep 1; done
  echo "server did not become ready" >&2; return 1
}
stop() { kill -TERM "$SERVER"; wait "$SERVER" || true; }

serve
taskset -c "$CLIENT_CORE" python -m nerserve.loadtest run --model span-conll03 --data "$DATA/conll03" --mode closed \
  --concurrency 1,4,16,64 --duration 15 --url "$URL" --out "$OUT/batched"
stop
serve --max-batch-size 1
taskset -c "$CLIENT_CORE" python -m nerserve.loadtest run --model span-conll03 --data "$DATA/conll03" --mode closed \
  --concurrency 1,64 --duration 15 --url "$URL" --out "$OUT/batch1"
stop
echo "written to $OUT" >&2
