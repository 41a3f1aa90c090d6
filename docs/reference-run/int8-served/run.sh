#!/bin/bash
# span-conll03 served, fp32 and INT8 alternating: the server on core 0 (one graph thread), the client on core 1
cd /work/main && . .venv/bin/activate
OUT=/tmp/int8served; PORT=8091; URL=http://127.0.0.1:$PORT
serve() {
  taskset -c 0 nerserve serve --port $PORT --models span-conll03 --threads 1 "$@" > $OUT/server.log 2>&1 &
  SERVER=$!
  for _ in $(seq 600); do curl -fs $URL/health/ready > /dev/null && return 0; sleep 1; done; return 1
}
stop() { kill -TERM $SERVER; wait $SERVER || true; }
for round in 1 2; do
  for precision in fp32 int8; do
    if [ $precision = int8 ]; then serve --int8; else serve; fi
    curl -s $URL/info | python3 -c "import json,sys; d=json.load(sys.stdin); print(d['precision'], d['batching'])" >> $OUT/info.log
    taskset -c 1 python -m nerserve.loadtest run --model span-conll03 --data ../shared/data/conll03 --mode closed --order shuffled \
      --concurrency 1,16,64 --duration 15 --url $URL --out $OUT/$precision-$round > $OUT/$precision-$round.log 2>&1
    stop
  done
done
echo done >> $OUT/info.log
