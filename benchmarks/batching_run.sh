#!/usr/bin/env bash
# The service issue's two throughput figures, with the load generator on its own core:
#   batching gain = sentences/s at concurrency 64 (one CoNLL test sentence per request) with the
#                   default batcher ÷ the same with --max-batch-size 1;
#   service overhead = end-to-end sentences/s ÷ the graph-time sentences/s of the same batches
#                   (server_graph_sentences_per_second in summary.json);
#   served ÷ offline = sentences/s at concurrency 64 over the whole CoNLL-2003 test split, each
#                   sentence once (loadtest --once) ÷ `nerserve eval --runtime onnx --threads 1` on the
#                   same split and core; the batching gain is also taken over that whole split;
# and what batching can gain at all on this machine, offline (benchmarks/batching_ceiling.py).
# The loads send the split shuffled (ORDER=file: in file order, where the 15-s levels time the two
# servers on different sentences: nerserve/loadtest/client.py, arrange).
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
ORDER=${ORDER:-shuffled}
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

taskset -c "$SERVER_CORE" nerserve eval span-conll03 --data "$DATA/conll03" --split test --runtime onnx --threads 1 \
  --json > "$OUT/offline-eval.json"

serve
taskset -c "$CLIENT_CORE" python -m nerserve.loadtest run --model span-conll03 --data "$DATA/conll03" --mode closed --order "$ORDER" \
  --concurrency 1,4,16,64 --duration 15 --url "$URL" --out "$OUT/batched"
taskset -c "$CLIENT_CORE" python -m nerserve.loadtest run --model span-conll03 --data "$DATA/conll03" --mode closed --order "$ORDER" \
  --concurrency 64 --once --duration 300 --url "$URL" --out "$OUT/whole-split"
stop
serve --max-batch-size 1
taskset -c "$CLIENT_CORE" python -m nerserve.loadtest run --model span-conll03 --data "$DATA/conll03" --mode closed --order "$ORDER" \
  --concurrency 1,64 --duration 15 --url "$URL" --out "$OUT/batch1"
taskset -c "$CLIENT_CORE" python -m nerserve.loadtest run --model span-conll03 --data "$DATA/conll03" --mode closed --order "$ORDER" \
  --concurrency 64 --once --duration 300 --url "$URL" --out "$OUT/whole-split-batch1"
stop
python - "$OUT" <<'EOF'
import json, sys
out = sys.argv[1]
def c64(run):
    return next(r for r in json.load(open(f"{out}/{run}/summary.json"))["runs"] if r["concurrency"] == 64)
batched, batch1 = c64("batched")["sentences_per_second"], c64("batch1")["sentences_per_second"]
whole, whole1 = c64("whole-split")["sentences_per_second"], c64("whole-split-batch1")["sentences_per_second"]
offline = json.load(open(f"{out}/offline-eval.json"))["sentences_per_second"]
print(f"c=64, 15 s: {batched:.1f} sentences/s batched, {batch1:.1f} with --max-batch-size 1: gain {batched / batch1:.3f} (bar 1.5)")
print(f"c=64, the whole test split once: {whole:.1f} batched, {whole1:.1f} with --max-batch-size 1: gain {whole / whole1:.3f}")
print(f"offline eval {offline:.1f} sentences/s: served/offline {whole / offline:.3f} (bar 0.8)")
EOF
echo "written to $OUT" >&2
