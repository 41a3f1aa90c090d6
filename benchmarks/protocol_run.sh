#!/usr/bin/env bash
# The papers' two speed tables on one dataset, every architecture's model for it in the same server
# run, bartner as the 1× row where a bartner model exists for the dataset (else the rows' absolute
# sentences/s only). SetGNER's protocol: the whole test set in batches of ≤ 800 source tokens;
# NAG-NER's: a fixed batch of 4. On an otherwise idle machine after `make install`:
#   bash benchmarks/protocol_run.sh cadec
#   bash benchmarks/protocol_run.sh genia
set -euo pipefail
cd "$(dirname "$0")/.."
. .venv/bin/activate
DATASET=${1:?usage: protocol_run.sh DATASET (conll03, genia or cadec)}
DATA=${DATA:-../shared/data}
OUT=${OUT:-docs/reference-run}
PORT=${PORT:-8014}
URL="http://127.0.0.1:$PORT"
MAX_SECONDS=${MAX_SECONDS:-30}

# every committed model for the dataset; diffusion at 1 and 5 steps as in the papers
MODELS=$(ls model_store | grep -- "-$DATASET\$" | paste -sd, -)
ROWS=$(echo "$MODELS" | tr , '\n' | sed -e "s/^\(diffusion-$DATASET\)\$/\1?steps=1\n\1?steps=5/" | paste -sd, -)
REFERENCE=()
if [ -d "model_store/bartner-$DATASET" ]; then REFERENCE=(--reference "bartner-$DATASET"); fi

nerserve serve --port "$PORT" --models "$MODELS" > "$OUT/server-protocol-$DATASET.log" 2>&1 &
SERVER=$!
trap 'kill -TERM $SERVER; wait $SERVER || true' EXIT
for _ in $(seq 900); do curl -fs "$URL/health/ready" > /dev/null && break; sleep 1; done
for table in setgen nag; do
  python -m nerserve.loadtest protocol --table "$table" --models "$ROWS" "${REFERENCE[@]}" --data "$DATA/$DATASET" \
    --url "$URL" --max-seconds "$MAX_SECONDS" --json > "$OUT/protocol-$table-all-$DATASET.json"
done
echo "written to $OUT/protocol-{setgen,nag}-all-$DATASET.json" >&2
