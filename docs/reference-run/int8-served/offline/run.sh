#!/bin/bash
# offline sentences/s at batch 32, one thread on one core, fp32 and INT8 alternating, two rounds
cd /work/main
for round in 1 2; do
for pair in span-conll03:conll03 nag-conll03:conll03 setgen-conll03:conll03 bartner-conll03:conll03 diffusion-conll03:conll03 span-genia:genia; do
  m=${pair%%:*}; d=${pair##*:}
  for v in "" "--int8"; do
    taskset -c 0 .venv/bin/python benchmarks/batching_ceiling.py --model $m --data ../shared/data/$d --sizes 32 --limit 512 --threads 1 $v --json > /tmp/int8off/$m${v:+-int8}-$round.json 2>/dev/null
  done
done
done
echo done > /tmp/int8off/done
