#!/usr/bin/env bash
# span-conll03 served by each CPU runtime and precision, in one sitting, alternating: ONNX Runtime fp32
# (the default) and INT8, OpenVINO fp32 and bf16 (docs/decisions/cpu-inference.md). Server on core 0
# with one graph thread, load client on core 1, closed loop, shuffled test split, DUR seconds a level.
#   bash benchmarks/cpu_runtimes.sh                                   # c = 1 and 64, one sentence a request
#   LEVELS=4 LOADARGS="--sentences-per-request 32" CONFIGS="onnx-fp32 onnx-int8 ov-bf16" bash benchmarks/cpu_runtimes.sh
# Offline and the entity sets against fp32:
#   taskset -c 1 nerserve eval span-conll03 --data ../shared/data/conll03 --runtime openvino --precision bf16 --threads 1 --json
#   taskset -c 1 python benchmarks/half_precision.py --runtime openvino --device cpu --precision bf16 --threads 1 \
#     --batch-size 32 --models span-conll03 --data ../shared/data/conll03
set -euo pipefail
cd "$(dirname "$0")/.."
. .venv/bin/activate
DATA=${DATA:-../shared/data}
OUT=${OUT:-build/cpu-runtimes}
PORT=${PORT:-8061}
URL="http://127.0.0.1:$PORT"
mkdir -p "$OUT"
declare -A ARGS=(
  [onnx-fp32]="--runtime onnx" [onnx-int8]="--runtime onnx --int8"
  [ov-fp32]="--runtime openvino" [ov-bf16]="--runtime openvino --precision bf16"
)
for round in ${ROUNDS:-1 2}; do
  for name in ${CONFIGS:-onnx-fp32 onnx-int8 ov-fp32 ov-bf16}; do
    # shellcheck disable=SC2086  # the arguments are words
    NERSERVE_DATA_ROOT="$DATA" taskset -c 0 nerserve serve --port "$PORT" --models span-conll03 --threads 1 ${ARGS[$name]} \
      > "$OUT/server-$name-$round.log" 2>&1 &
    server=$!
    for _ in $(seq 600); do curl -fs "$URL/health/ready" > /dev/null && break; sleep 1; done
    # shellcheck disable=SC2086
    taskset -c 1 python -m nerserve.loadtest run --model span-conll03 --data "$DATA/conll03" --mode closed --order shuffled \
      --concurrency "${LEVELS:-1,64}" ${LOADARGS:-} --duration "${DUR:-15}" --url "$URL" --out "$OUT/$name-$round" > /dev/null
    kill -TERM "$server"
    wait "$server"  # exits 0 after its drain, or the run stops here
    python - "$OUT/$name-$round/summary.json" "$name" "$round" <<'PY'
import json, sys
runs = json.load(open(sys.argv[1]))["runs"]
levels = (f"c={r['concurrency']}: {r['sentences_per_second']:.1f}/s p50 {r['latency_ms']['p50']:.1f} p99 {r['latency_ms']['p99']:.1f}" for r in runs)
print(sys.argv[2], sys.argv[3], " ".join(levels))
PY
  done
done
