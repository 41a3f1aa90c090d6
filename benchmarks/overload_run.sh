#!/usr/bin/env bash
# Overload on a 2-core machine: the server pinned to core 0 with one graph thread, the load client
# (aiohttp + uvloop, 2,000 connections at most, one CoNLL-2003 test sentence per request) on core 1.
#   1. capacity: closed loop at 32 connections for 20 s; a 429 there fails the run (the capacity
#      must be what the server serves without refusing)
#   2. RUNS (default 3) open-loop Poisson runs at 3× capacity for 20 s each, against ROUTE
#      (extract: POST /extract; v2: POST /v2/models/span-conll03/infer)
#   bars: goodput (200s within 2 s, per second of the offered window) ≥ 0.9 × capacity; admitted
#   p99 ≤ 2 s; 429 p99 ≤ 50 ms; no 5xx, no timeouts or connection errors
# The load sends the split shuffled (ORDER=file: in file order, where the capacity probe's 20 s
# cover the split's longer first 2,100 sentences and the 3x runs all of it: nerserve/loadtest/client.py).
# A training run sharing the machine: PAUSE_PID=<pid> stops it for the run (kill -STOP / -CONT).
# SERVER_CORES=0,1 gives the server both cores (two graph lanes by default; the client shares core 1).
# Usage: benchmarks/overload_run.sh [OUT]   (default docs/reference-run/overload; PORT=8041 RUNS=3 ROUTE=extract)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-docs/reference-run/overload}
PORT=${PORT:-8041}
RUNS=${RUNS:-3}
ROUTE=${ROUTE:-extract}
ORDER=${ORDER:-shuffled}
SERVER_CORES=${SERVER_CORES:-0}
BIN=.venv/bin
mkdir -p "$OUT"

if [ -n "${PAUSE_PID:-}" ]; then
  kill -STOP "$PAUSE_PID"
  trap 'kill -CONT "$PAUSE_PID"' EXIT
fi
taskset -c "$SERVER_CORES" "$BIN/nerserve" serve --models span-conll03 --threads 1 --port "$PORT" 2> "$OUT/server.log" &
SERVER=$!
trap 'kill "$SERVER"; wait "$SERVER" || true; [ -z "${PAUSE_PID:-}" ] || kill -CONT "$PAUSE_PID"' EXIT
until curl -sf "localhost:$PORT/health/ready" > /dev/null; do sleep 1; done

load() {
  taskset -c 1 "$BIN/python" -m nerserve.loadtest run --model span-conll03 --data ../shared/data/conll03 \
    --url "http://127.0.0.1:$PORT" --connections 2000 --route "$ROUTE" --order "$ORDER" "$@"
}
field() { "$BIN/python" -c "import json, sys; print($1)"; }

load --mode closed --concurrency 32 --duration 20 --out "$OUT/capacity" > /dev/null
REFUSED=$(field "json.load(open('$OUT/capacity/summary.json'))['runs'][0]['http_429']")
if [ "$REFUSED" != 0 ]; then echo "capacity probe: $REFUSED requests refused with 429 (must be none)"; exit 1; fi
CAPACITY=$(field "json.load(open('$OUT/capacity/summary.json'))['runs'][0]['sentences_per_second']")
for run in $(seq 1 "$RUNS"); do
  load --mode open --rate "$(field "round(3 * $CAPACITY)")" --duration 20 --out "$OUT/open-3x-$run" > /dev/null
done
curl -s "localhost:$PORT/metrics" | grep '^nerserve_requests_total' > "$OUT/requests_total.txt"  # the server's own count

"$BIN/python" - "$OUT" "$CAPACITY" "$RUNS" <<'PY'
import json, sys
out, capacity, runs = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
meta = json.load(open(f"{out}/capacity/summary.json"))["meta"]
print(f"client: {meta['client_library']} on cores {meta['client_cores']}, {meta['connections']} connections at most")
print(f"capacity (closed loop, 32 connections, no 429) {capacity:.1f} sentences/s")
rows = []
for run in range(1, runs + 1):
    r = json.load(open(f"{out}/open-3x-{run}/summary.json"))["runs"][0]
    statuses = r["status_counts"]
    fivexx = sum(v for k, v in statuses.items() if k.startswith("5"))
    row = {
        "run": run, "offered": r["rate"], "goodput_ratio": r["goodput_sentences_per_second"] / capacity,
        "admitted_p95_ms": r["latency_ms"]["p95"], "admitted_p99_ms": r["latency_ms"]["p99"],
        "admitted_over_2s": r["ok_later_than_goodput_bound"], "refused_p99_ms": r["rejected_latency_ms"]["p99"],
        "statuses": statuses, "5xx": fivexx, "timeouts": statuses.get("0", 0),
    }
    row["passed"] = (row["goodput_ratio"] >= 0.9 and row["admitted_p99_ms"] <= 2000 and row["refused_p99_ms"] <= 50
                     and fivexx == 0 and row["timeouts"] == 0)
    rows.append(row)
    print(f"run {run}: offered {r['rate']:g}/s, goodput {row['goodput_ratio']:.3f} of capacity (≥ 0.9), admitted p95 "
          f"{row['admitted_p95_ms']:.0f} / p99 {row['admitted_p99_ms']:.0f} ms (≤ 2000; {row['admitted_over_2s']} over 2 s), "
          f"429 p99 {row['refused_p99_ms']:.1f} ms (≤ 50), 5xx {fivexx}, timeouts {row['timeouts']}: "
          + ("pass" if row["passed"] else "FAIL"))
json.dump({"capacity": capacity, "client": meta, "runs": rows}, open(f"{out}/overload.json", "w"), indent=2)
PY
