#!/usr/bin/env bash
# Overload (issue 15) on a 2-core machine: the server on core 0, the load generator on core 1.
#   1. capacity: closed loop at concurrency 8, 16, 32; capacity = the best goodput without a 429
#   2. 3× capacity, open loop (Poisson) for 60 s: goodput, p99 of the accepted, p99 of the 429s
#   3. the open-loop curve: 8 offered loads from 0.25× to 4× capacity, 20 s each (overload.png)
# Usage: benchmarks/overload_run.sh [OUT]   (default docs/reference-run/overload; port: PORT=8041)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-docs/reference-run/overload}
PORT=${PORT:-8041}
BIN=.venv/bin
mkdir -p "$OUT"

taskset -c 0 "$BIN/nerserve" serve --models span-conll03 --threads 1 --port "$PORT" 2> "$OUT/server.log" &
SERVER=$!
trap 'kill "$SERVER"; wait "$SERVER" || true' EXIT
until curl -sf "localhost:$PORT/health/ready" > /dev/null; do sleep 1; done

load() {
  taskset -c 1 "$BIN/python" -m nerserve.loadtest run --model span-conll03 --data ../shared/data/conll03 \
    --url "http://127.0.0.1:$PORT" "$@"
}
field() { "$BIN/python" -c "import json, sys; print($1)"; }

load --mode closed --concurrency 8,16,32 --duration 20 --out "$OUT/capacity"
CAPACITY=$(field "max(r['sentences_per_second'] for r in json.load(open('$OUT/capacity/summary.json'))['runs'] if r['http_429'] == 0)")
load --mode open --rate "$(field "round(3 * $CAPACITY)")" --duration 60 --out "$OUT/open-3x"
load --mode open --sweep "$(field "f'{0.25 * $CAPACITY:.0f}:{4 * $CAPACITY:.0f}:8'")" --duration 20 --out "$OUT/sweep"

curl -s "localhost:$PORT/metrics" | grep '^nerserve_requests_total' > "$OUT/requests_total.txt"  # the server's own count

"$BIN/python" - "$OUT" "$CAPACITY" <<'EOF'
import json, sys
out, capacity = sys.argv[1], float(sys.argv[2])
run = json.load(open(f"{out}/open-3x/summary.json"))["runs"][0]
statuses = run["status_counts"]
print(f"capacity {capacity:.1f} sentences/s; offered {run['rate']:g} requests/s ({run['rate'] / capacity:.2f}×)")
print(f"goodput {run['sentences_per_second']:.1f} = {run['sentences_per_second'] / capacity:.3f} of capacity (bar ≥ 0.9)")
print(f"p99 of accepted {run['latency_ms']['p99']:.0f} ms (bar ≤ 2000); p99 of 429s {run['rejected_latency_ms']['p99']:.1f} ms (bar ≤ 50)")
print(f"statuses {statuses}: 5xx {sum(v for k, v in statuses.items() if k.startswith('5'))}, timeouts/connection errors {statuses.get('0', 0)}")
EOF
