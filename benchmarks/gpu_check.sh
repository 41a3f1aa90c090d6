#!/usr/bin/env bash
# The GPU figures (docs/gpu.md) in one run, on one device. The two served ratios that a card has not
# yet met come first, for every way of serving that could meet them, then the bars a card has met,
# then what explains them, so that a lease's first minutes answer what is still open:
#   1. the served ratios' denominator: span-conll03 offline (eager torch: tokenise → graphs →
#      decode) at batch 32/128/256/512, length-sorted and in arrival order, plain and with the
#      backbone replayed from CUDA graphs, and so with all but the backbone and the BiLSTM compiled
#      by torch.compile (--compiled-heads);
#   2. span-conll03 served, closed loop, 1 sentence a request at c = 1/16/64/256 and 32 a request
#      at c = 16, the load client in its own processes on its own cores, with its ceiling
#      (served_check.py): in the service's own layout on a device (HTTP worker processes in front of
#      the engine, two graph lanes, the backbone replayed), each batch's way through the engine
#      logged (--batch-log: batches-span-graphs.jsonl, read level by level with batch_timeline.py),
#      then who holds the engine's, the workers' interpreter locks at c = 256 (py-spy --gil:
#      profile-served-span-graphs, by interpreter_profile.py); with the heads compiled
#      (--compiled-heads: a few fused kernels a pass rather than an operator at a time); with the graphs in two processes of
#      their own (--graph-process --graph-processes 2: a lane each, each launching from an
#      interpreter of its own, where the H200's eager passes were bound by one interpreter's
#      launching); with batches of up to 512 sentences at c = 16 with 32 a request; with one graph
#      lane; then as that with the graphs in a process of their own (--graph-process: two lanes
#      there; profiled too), with all but the
#      backbone traced (--traced-heads), through ONNX Runtime's CUDA execution provider where this
#      onnxruntime has it (exported here; a pass that holds no interpreter lock), with the graph
#      process and traced heads both, through TorchScript
#      (exported here), and in half precision (weights converted at load; the backbone's replay
#      against its plain pass in half first, then offline, half's own denominator);
#   — every served ratio has its figures by here —
#   3. the bare-encoder limit: the backbone alone, fp32 and fp16 (weights converted with attention
#      off cuDNN's kernels, as the service runs it; then torch's choice of kernels, whose cuDNN
#      execution graphs, built per shape, the autocast row after it finds built), batch
#      1/32/128/512, length-sorted; span offline at batch 1;
#   4. the backbone replayed from CUDA graphs (serve's default in fp32 on CUDA): entity sets against
#      the plain program's on the whole test split, and so with traced heads and compiled heads;
#   5. setgen- and bartner-conll03 served at c = 64 (both with --cuda-graphs where 4 found it exact
#      and faster);
#   — every bar has its figures by here; the rest explains them —
#   6. a pass alone, on fresh shapes, and beside a thread running Python or preparing, at three
#      switch intervals (pass_anatomy.py), eager, in a process of its own, traced and compiled; span served
#      with every thread asking for the lock after 0.05 ms (--interpreter-switch-ms);
#   7. as measured before: span served as 2 with the plain program (--no-cuda-graphs); the batch-1
#      server at c = 64; TorchScript offline; ONNX Runtime offline, profiled (onnx_profile.py; and
#      so its export whose backbone runs the rows' padding) and with one graph lane;
#   8. span served as 2 with the front in the engine's process; offline
#      with two batches in flight; a profile of its batches, and with compiled heads; the pass anatomy of the TorchScript
#      graphs; half precision against fp32 (entity sets, F1, speed) for span- and setgen-conll03;
#   9. nag, setgen, bartner and diffusion (1 step) offline, as 1;
#   10. summary.json: the ratios the engine issue asks for.
# Offline, bare and served figures all take samples of CoNLL-2003 test (the split shuffled, seeded:
# --order in batching_ceiling.py, bare_encoder.py and served_check.py), so that the ratios divide
# figures taken on the same kind of sentences (the split's first 2,048 average 14.8 words, the
# split 13.4). Graphs are built here from model_store (a few MB a model), never carried. Every step writes JSON
# under $OUT and a failed step is recorded, not fatal.
#
#   OUT=build/gpu-check DATA=../shared/data bash benchmarks/gpu_check.sh --device cuda
#   OUT=build/gpu-check bash benchmarks/gpu_check.sh --device cpu --quick   # a dry run of every step
#   RESUME=1 OUT=… bash benchmarks/gpu_check.sh --device cuda   # a run cut short, continued: the
#   steps whose JSON is there already are kept (and their servers not started again)
set -uo pipefail
cd "$(dirname "$0")/.."
DEVICE=cuda
QUICK=0
ONNX_ONLY=0
while [ $# -gt 0 ]; do
  case "$1" in
    --device) DEVICE=$2; shift 2 ;;
    --quick) QUICK=1; shift ;;
    --onnx-only) ONNX_ONLY=1; shift ;;  # ONNX Runtime's steps alone (e.g. once onnxruntime-gpu has arrived), into the same OUT
    *) echo "usage: gpu_check.sh [--device cuda|cpu] [--quick] [--onnx-only]" >&2; exit 2 ;;
  esac
done
# the project's own environment where there is one (a checkout here), else the machine's (the GPU
# machine, with the bundle on PYTHONPATH)
if [ -z "${PY:-}" ]; then if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi; fi
DATA=${DATA:-../shared/data}
OUT=${OUT:-build/gpu-check}
RESUME=${RESUME:-0}
PORT=${PORT:-8013}
URL="http://127.0.0.1:$PORT"
CORES=$(nproc)
# the server on the first cores, the load client's processes on the last four (on few cores: shared)
if [ "$CORES" -ge 8 ]; then SERVER_CORES="0-$((CORES - 5))"; CLIENT_CORES="$((CORES - 4))-$((CORES - 1))"; else SERVER_CORES="0-$((CORES - 1))"; CLIENT_CORES=""; fi
# HTTP workers for the split server: the server's cores less two (the engine's loop and its batch
# threads), at most 8
SERVER_CORE_COUNT=$([ "$CORES" -ge 8 ] && echo $((CORES - 4)) || echo "$CORES")
HTTP_WORKERS=$(( SERVER_CORE_COUNT - 2 > 8 ? 8 : (SERVER_CORE_COUNT - 2 < 2 ? 2 : SERVER_CORE_COUNT - 2) ))
if [ "$QUICK" = 1 ]; then
  SIZES=32; LIMIT=64; OTHER_LIMIT=64; BATCH1_LIMIT=32; SECONDS_PER_LEVEL=2; LEVELS=1,16
  HALF_LIMIT=64; SERVED_MODELS="setgen-conll03"; ANATOMY_SIZES=1,16; ANATOMY_BATCHES=4
else
  SIZES=32,128,256,512; LIMIT=2048; OTHER_LIMIT=512; BATCH1_LIMIT=256; SECONDS_PER_LEVEL=5; LEVELS=1,16,64,256
  HALF_LIMIT=""; SERVED_MODELS="setgen-conll03 bartner-conll03"; ANATOMY_SIZES=1,16,64,128; ANATOMY_BATCHES=12
fi
HALF=$([ "$DEVICE" = cpu ] && echo bf16 || echo fp16)  # on the CPU bf16 (a dry run of the steps)
HALF_GRAPHS_FLAG=""  # --cuda-graphs where the replay in half kept the entity sets (served_half)
mkdir -p "$OUT"
# ONNX Runtime's CUDA provider loads CUDA and cuDNN by name: where they came as pip packages (a
# CUDA torch's nvidia-* wheels), their folders go on the loader's path
NVIDIA_LIBS=$($PY -c 'import nvidia, pathlib; print(":".join(str(p) for d in nvidia.__path__ for p in pathlib.Path(d).glob("*/lib")))' 2>/dev/null || true)
export LD_LIBRARY_PATH="${NVIDIA_LIBS}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
log() { echo "[$(date +%H:%M:%S)] $*" | tee -a "$OUT/progress.log" >&2; }
have() {  # have NAME...: with RESUME=1, every step NAME wrote its JSON already
  [ "$RESUME" = 1 ] || return 1
  local name
  for name in "$@"; do grep -qs '^{' "$OUT/$name.json" || return 1; done
}
todo() { ! have "$@"; }  # todo NAME...: some step NAME is still to run
STEP=""  # the running step's timeout process
SERVER=""
step() {  # step NAME TIMEOUT_SECONDS COMMAND...: stdout to $OUT/NAME.json, stderr to $OUT/NAME.log
  local name=$1 limit=$2; shift 2
  if have "$name"; then log "kept $name"; return; fi
  log "start $name"
  # in the background, so that a cut (below) reaches it at once; written aside and moved once the
  # step has ended, so that a run cut mid-step leaves no JSON for RESUME to keep
  timeout "$limit" "$@" > "$OUT/$name.json.part" 2> "$OUT/$name.log" &
  STEP=$!
  wait "$STEP" || log "FAILED $name (exit $?)"
  STEP=""
  mv "$OUT/$name.json.part" "$OUT/$name.json"
  log "end $name"
}
# cut short (the call's `timeout`, or ^C): the running step and server stop too, so that nothing
# holds the device or the port when RESUME=1 continues. `timeout` puts each step in a process group
# of its own, which a signal to this script's group does not reach.
cut() {
  log "cut short: stopping what runs${STEP:+ (a step)}${SERVER:+ (a server)}"
  [ -n "$STEP" ] && kill -TERM "$STEP" 2>/dev/null && wait "$STEP" 2>/dev/null
  stop
  exit 143
}
trap cut TERM INT

log "device $DEVICE, $CORES cores (server $SERVER_CORES, client ${CLIENT_CORES:-shared}), quick=$QUICK"
log "bundle: ${BUNDLE_BYTES:-unknown} bytes; expected run: $([ "$QUICK" = 1 ] && echo "about 7 minutes" || echo "over 12 minutes (an H200 ran 545 s, then 185 s resumed, with steps left)"); cut short, RESUME=1 continues"
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || echo "no nvidia-smi"
  lscpu 2>/dev/null | grep -E '^(Model name|CPU\(s\)|CPU max MHz)'  # the host whose interpreter launches the passes
  $PY -c 'import torch, onnxruntime as o; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.is_available()); print("onnxruntime", o.__version__, o.get_available_providers())'
  # what --compiled-heads needs: Triton on a GPU (and a C compiler for its launchers), a C++ compiler on the CPU
  $PY -c 'import triton; print("triton", triton.__version__)' 2>&1 | tail -1
  command -v gcc cc g++ | tr '\n' ' '; echo
} > "$OUT/environment.txt" 2>&1

ready() {  # up to 3 minutes: CUDA graphs' captures, and torch.compile's at load (--compiled-heads) on a cold cache
  for _ in $(seq 360); do curl -fs "$URL/health/ready" > /dev/null && return 0; kill -0 "$SERVER" 2>/dev/null || return 1; sleep 0.5; done
  return 1
}
serve() {  # serve NAME MODEL RUNTIME [flags…]: a server pinned to the server cores, until stop
  local name=$1 model=$2 runtime=$3; shift 3
  taskset -c "$SERVER_CORES" $PY -m nerserve serve --port "$PORT" --models "$model" --runtime "$runtime" \
    --device "$DEVICE" --http-workers 1 "$@" > "$OUT/server-$name.log" 2>&1 &
  SERVER=$!
  ready || { log "FAILED server $name (see server-$name.log)"; stop; return 1; }
}
stop() { [ -n "$SERVER" ] && kill -TERM "$SERVER" 2>/dev/null && wait "$SERVER" 2>/dev/null; SERVER=""; }
# py-spy: on PATH, where gpu_bundle.sh unpacked the bundle's wheels (a folder on PYTHONPATH), or beside $PY
PYSPY=${PYSPY:-$(command -v py-spy || true)}
if [ -z "$PYSPY" ]; then
  for dir in ${PYTHONPATH:+${PYTHONPATH//:/ }} "$(dirname "$PY")/.."; do if [ -x "$dir/bin/py-spy" ]; then PYSPY=$dir/bin/py-spy; break; fi; done
fi
PROFILE_SECONDS=5
profile_served() {  # profile_served NAME MODEL: who holds each of the running server's interpreter
  # locks (py-spy --gil: the engine, its HTTP workers, a graph process) under a closed loop at the
  # top level, one sentence a request, sampled after its clients have started; a level of its own, so
  # that the sampler perturbs no bar's figure
  local name=$1 model=$2 top=${LEVELS##*,}
  if have "profile-served-$name"; then log "kept profile-served-$name"; return; fi
  if [ -z "$PYSPY" ]; then log "skipped profile-served-$name: no py-spy"; return; fi
  ( sleep 2; ${CLIENT_CORES:+taskset -c "$CLIENT_CORES"} "$PYSPY" record --pid "$SERVER" --subprocesses --gil \
      --threads --rate 250 --duration "$PROFILE_SECONDS" --format raw -o "$OUT/profile-served-$name.txt" ) \
    > "$OUT/profile-served-$name-py-spy.log" 2>&1 &
  local sampler=$!
  step "served-$name-profiled" 120 $PY benchmarks/served_check.py --url "$URL" --model "$model" --data "$DATA/conll03" \
    --levels "$top" --per-request 1 --duration $((PROFILE_SECONDS + 3)) --processes 4 --cores "$CLIENT_CORES" --no-ceiling
  wait "$sampler"
  step "profile-served-$name" 60 $PY benchmarks/interpreter_profile.py "$OUT/profile-served-$name.txt" \
    --rate 250 --seconds "$PROFILE_SECONDS"
}
served() {  # served NAME MODEL LEVELS PER_REQUEST
  step "served-$1" 300 $PY benchmarks/served_check.py --url "$URL" --model "$2" --data "$DATA/conll03" \
    --levels "$3" --per-request "$4" --duration "$SECONDS_PER_LEVEL" --processes 4 --cores "$CLIENT_CORES"
}
offline() {  # offline MODEL SENTENCES [batching_ceiling flags…]: batch 1 on fewer sentences, the rest on SENTENCES
  offline_batch1 "$1" "$1" "${@:3}"
  offline_batches "$1" "$@"
}
offline_batch1() {  # offline_batch1 NAME MODEL [flags…]: batch 1, on fewer sentences, as offline-NAME-batch1
  local name=$1 model=$2; shift 2
  step "offline-$name-batch1" 300 $PY benchmarks/batching_ceiling.py --model "$model" --data "$DATA/conll03" \
    --runtime eager --device "$DEVICE" --sizes 1 --limit "$BATCH1_LIMIT" --json "$@"
}
offline_batches() {  # offline_batches NAME MODEL SENTENCES [flags…]: the larger batches, as offline-NAME
  local name=$1 model=$2 sentences=$3; shift 3
  step "offline-$name" 600 $PY benchmarks/batching_ceiling.py --model "$model" --data "$DATA/conll03" \
    --runtime eager --device "$DEVICE" --sizes "$SIZES" --limit "$sentences" --json "$@"
}

replay_flag() {  # replay_flag CHECK faster|any FALLBACK: --cuda-graphs where CHECK's comparison kept the
  # entity sets (and, with `faster`, ran batches of 8 faster), else FALLBACK (also with no comparison:
  # the CPU, or the check failed)
  local flag
  flag=$($PY - "$OUT/$1.json" "$2" <<'PICK' 2>/dev/null
import json, sys
report = json.loads(open(sys.argv[1]).read().splitlines()[-1])
at_8 = {row["batch_size"]: row for row in report["sentences_per_second"]}.get(8)
faster = sys.argv[2] != "faster" or (at_8 and at_8["cuda_graphs"] > at_8["plain"])
print("--cuda-graphs" if report["passes"] and faster else "")
PICK
)
  echo "${flag:-${3:-}}"
}

has_onnx_cuda() {  # this onnxruntime can run on the device (the CPU always can: a dry run)
  [ "$DEVICE" = cpu ] || $PY -c 'import onnxruntime as o, sys; sys.exit("CUDAExecutionProvider" not in o.get_available_providers())' 2>/dev/null
}
served_onnx() {  # span-conll03 through ONNX Runtime on the device in the service's layout: a pass
  # that runs without the interpreter lock, beside the eager remedies (in step 2)
  if ! has_onnx_cuda; then log "skipped ONNX Runtime on CUDA: this onnxruntime has no CUDA execution provider"; return; fi
  step export-onnx 600 $PY -m nerserve export span-conll03 --format onnx --parity-sentences 32
  if todo served-span-onnx-split-1 served-span-onnx-split-32 \
    && serve span-onnx-split span-conll03 onnx --http-workers "$HTTP_WORKERS"; then
    served span-onnx-split-1 span-conll03 "$LEVELS" 1
    served span-onnx-split-32 span-conll03 16 32
    stop
  fi
}
onnx_explained() {  # ONNX Runtime offline, where its passes' time goes (its own profiler: the nodes
  # each provider ran, the copies it inserted, the time outside the nodes), and with one graph lane
  # against the device's default two (the next pass launched while one runs) (step 7; after
  # served_onnx, which exports)
  has_onnx_cuda || return 0
  step offline-onnx-span-conll03 300 $PY benchmarks/batching_ceiling.py --model span-conll03 \
    --data "$DATA/conll03" --runtime onnx --device "$DEVICE" --sizes "1,$SIZES" --limit "$LIMIT" --json
  step profile-onnx-span 180 $PY benchmarks/onnx_profile.py --model span-conll03 --data "$DATA/conll03" \
    --device "$DEVICE" --sizes "1,${SIZES##*,}"
  # the same with the backbone running its rows' padding, as eager torch on a device does: what the
  # CPU's choice (real sub-words only, a NonZero the host must wait for) costs the GPU image's path
  step export-onnx-padded 600 $PY -m nerserve export span-conll03 --format onnx --padded-backbone --parity-sentences 32
  step profile-onnx-span-padded 180 $PY benchmarks/onnx_profile.py --model span-conll03 --data "$DATA/conll03" \
    --device "$DEVICE" --sizes "1,${SIZES##*,}" --padded-backbone
  if todo served-span-onnx-one-lane && serve span-onnx-one-lane span-conll03 onnx --http-workers "$HTTP_WORKERS" --graph-lanes 1; then
    served span-onnx-one-lane span-conll03 "$LEVELS" 1
    stop
  fi
}

# each way of serving span: started once, its steps skipped where kept (RESUME=1)
REPLAYED=$([ "$DEVICE" = cpu ] && echo --no-cuda-graphs || echo --cuda-graphs)
served_default() {  # the service's layout on a device: HTTP worker processes in front of the engine,
  # two graph lanes, the backbone replayed from CUDA graphs (serve's default for fp32 eager on CUDA;
  # a capture needs a GPU); each batch's way through the engine logged; who holds which interpreter
  if todo served-span-graphs-1 served-span-graphs-32 \
    && serve span-graphs span-conll03 eager --http-workers "$HTTP_WORKERS" "$REPLAYED" \
      --batch-log "$OUT/batches-span-graphs.jsonl"; then
    served span-graphs-1 span-conll03 "$LEVELS" 1
    served span-graphs-32 span-conll03 16 32
    profile_served span-graphs span-conll03
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv > "$OUT/gpu-memory-span-cuda-graphs.csv" 2>&1
    stop
  fi
}
served_large_batches() {  # the service's layout with batches of up to 512 sentences rather than 256:
  # 16 requests of 32 keep 512 in flight, which batches of 256 serve in two passes or more, where
  # offline the pass of 512 is the fastest (H200, 37dd7c2)
  if todo served-span-graphs-512-32 \
    && serve span-graphs-512 span-conll03 eager --http-workers "$HTTP_WORKERS" "$REPLAYED" --max-batch-size 512; then
    served span-graphs-512-32 span-conll03 16 32
    stop
  fi
}
served_one_lane() {  # one graph lane against the device's default two: a stage fewer for a closed
  # loop's cohorts (on the H200 c = 256 went in passes of a quarter of the loop, each costing an
  # offline batch of its size, where passes of half would have served more: gpu_summary.py's
  # served_passes)
  if todo served-span-one-lane served-span-one-lane-32 \
    && serve span-one-lane span-conll03 eager --http-workers "$HTTP_WORKERS" "$REPLAYED" --graph-lanes 1; then
    served span-one-lane span-conll03 "$LEVELS" 1
    served span-one-lane-32 span-conll03 16 32
    stop
  fi
}
served_split() {  # the graphs in a process of their own, two lanes there, each over a pipe of its
  # own: their launches no longer share the engine's interpreter lock
  if todo served-span-split-1 served-span-split-32 \
    && serve span-split span-conll03 eager --graph-process --http-workers "$HTTP_WORKERS" "$REPLAYED"; then
    served span-split-1 span-conll03 "$LEVELS" 1
    served span-split-32 span-conll03 16 32
    profile_served span-split span-conll03
    stop
  fi
}
served_compiled() {  # all but the backbone and the BiLSTM compiled by torch.compile: a pass launches
  # a few fused kernels where eager launches each operator from Python
  if todo served-span-compiled-1 served-span-compiled-32 \
    && serve span-compiled span-conll03 eager --http-workers "$HTTP_WORKERS" "$REPLAYED" --compiled-heads; then
    served span-compiled-1 span-conll03 "$LEVELS" 1
    served span-compiled-32 span-conll03 16 32
    stop
  fi
}
served_split_processes() {  # the graph lanes dealt out over two processes, a lane each: the passes,
  # bound by Python launching their kernels, launched from two interpreters side by side
  if todo served-span-split-processes-1 served-span-split-processes-32 \
    && serve span-split-processes span-conll03 eager --graph-process --graph-processes 2 --http-workers "$HTTP_WORKERS" "$REPLAYED"; then
    served span-split-processes-1 span-conll03 "$LEVELS" 1
    served span-split-processes-32 span-conll03 16 32
    stop
  fi
}
served_traced() {  # all but the backbone traced: a pass takes the interpreter lock a few times
  if todo served-span-traced-1 served-span-traced-32 \
    && serve span-traced span-conll03 eager --http-workers "$HTTP_WORKERS" "$REPLAYED" --traced-heads; then
    served span-traced-1 span-conll03 "$LEVELS" 1
    served span-traced-32 span-conll03 16 32
    stop
  fi
}
served_split_traced() {
  if todo served-span-split-traced \
    && serve span-split-traced span-conll03 eager --graph-process --http-workers "$HTTP_WORKERS" "$REPLAYED" --traced-heads; then
    served span-split-traced span-conll03 "$LEVELS" 1
    stop
  fi
}
served_torchscript() {  # the traced graphs on the device (traced on the CPU, their device constants
  # retargeted at load): operators dispatched from C++, not Python; served in the service's layout
  # (no graph process: TorchScript runs without the interpreter lock)
  step export-torchscript 600 $PY -m nerserve export span-conll03 --format torchscript --parity-sentences 32
  if todo served-span-torchscript-1 served-span-torchscript-32 \
    && serve span-torchscript span-conll03 torchscript --http-workers "$HTTP_WORKERS"; then
    served span-torchscript-1 span-conll03 "$LEVELS" 1
    served span-torchscript-32 span-conll03 16 32
    stop
  fi
}
served_half() {  # half precision (weights converted at load; the CPU serves fp32 only) in the
  # service's layout: the backbone's replay against its plain pass in half first (padded shapes may
  # pick other kernels, whose rounding differs more in half), then offline (the denominator of its
  # served figures) and served, replayed where that kept the entity sets
  [ "$DEVICE" != cpu ] || return 0
  step cuda-graphs-check-half 300 $PY benchmarks/cuda_graphs_check.py --models span-conll03 \
    --data "$DATA/conll03" --device "$DEVICE" --precision "$HALF"
  HALF_GRAPHS_FLAG=$(replay_flag cuda-graphs-check-half any "")
  log "half precision with: ${HALF_GRAPHS_FLAG:-no CUDA graphs}"
  offline_batches span-conll03-half span-conll03 "$LIMIT" --precision "$HALF" $HALF_GRAPHS_FLAG
  if todo served-span-half served-span-half-32 \
    && serve span-half span-conll03 eager --precision "$HALF" --http-workers "$HTTP_WORKERS" $HALF_GRAPHS_FLAG; then
    served span-half span-conll03 "$LEVELS" 1
    served span-half-32 span-conll03 16 32
    stop
  fi
}

if [ "$ONNX_ONLY" = 1 ]; then served_onnx; onnx_explained; fi
if [ "$ONNX_ONLY" = 0 ]; then
# the served ratios' denominator: span offline at the larger batches, plain and with the backbone
# replayed (the summary divides by the better); batch 1 comes with the other bars below
offline_batches span-conll03 span-conll03 "$LIMIT"
if [ "$DEVICE" != cpu ]; then offline_batches span-conll03-cuda-graphs span-conll03 "$LIMIT" --cuda-graphs; fi
offline_batches span-conll03-compiled span-conll03 "$LIMIT" $([ "$DEVICE" = cpu ] || echo --cuda-graphs) --compiled-heads
# then every way of serving that could meet them, the likeliest first
served_default
served_compiled
served_split_processes
served_large_batches
served_one_lane
served_split
served_traced
served_onnx
served_split_traced
served_torchscript
served_half
# — every served ratio has its figures by here; then the other bars (each met on the last card) —
step bare-encoder 300 $PY benchmarks/bare_encoder.py --device "$DEVICE" --data "$DATA/conll03" \
  --sizes "1,$SIZES" --precisions "fp32,$HALF-no-cudnn-attention,$HALF,$HALF-autocast" --limit "$LIMIT"
offline_batch1 span-conll03 span-conll03
if [ "$DEVICE" != cpu ]; then
  # the replay's entity sets against the plain program's on the whole test split, speed (to batch
  # 512, both programs in one process, beside the offline rows that take each in a process of its
  # own: the two have disagreed from batch 128 on, docs/gpu.md), load time, memory
  step cuda-graphs-check 300 $PY benchmarks/cuda_graphs_check.py --models span-conll03 \
    --data "$DATA/conll03" --device "$DEVICE" --sizes 1,8,32,128,512 --timed 1024
  offline_batch1 span-conll03-cuda-graphs span-conll03 --cuda-graphs
  step cuda-graphs-check-traced 300 $PY benchmarks/cuda_graphs_check.py --models span-conll03 \
    --data "$DATA/conll03" --device "$DEVICE" --sizes 1,8,32,128 --timed 1024 --traced-heads
  step cuda-graphs-check-compiled 300 $PY benchmarks/cuda_graphs_check.py --models span-conll03 \
    --data "$DATA/conll03" --device "$DEVICE" --sizes 1,8,32,128 --timed 1024 --compiled-heads
fi
# setgen and bartner (the pair of one bar) served alike: with CUDA graphs where the comparison above
# found span's entity sets kept and its batches of 8 faster with them (each served JSON's
# `served_as` names what ran)
GRAPHS_FLAG=$(replay_flag cuda-graphs-check faster --no-cuda-graphs)
log "setgen and bartner served with: $GRAPHS_FLAG"
for model in $SERVED_MODELS; do
  if todo "served-$model" && serve "$model" "$model" eager --http-workers "$HTTP_WORKERS" $GRAPHS_FLAG; then served "$model" "$model" 64 1; stop; fi
done
# — every bar has its figures by here; what follows explains them —
# a pass alone, on fresh shapes, and beside a thread running Python or preparing, at the server's
# switch interval and lower ones (an eager pass releases the interpreter lock at every operator):
# eager, in a process of its own, traced; the service's layout with every thread asking for the lock
# after 0.05 ms
step pass-anatomy 300 $PY benchmarks/pass_anatomy.py --model span-conll03 --data "$DATA/conll03" --device "$DEVICE" \
  --sizes "$ANATOMY_SIZES" --batches "$ANATOMY_BATCHES" --repeats "$ANATOMY_BATCHES"
step pass-anatomy-graph-process 300 $PY benchmarks/pass_anatomy.py --model span-conll03 --data "$DATA/conll03" \
  --device "$DEVICE" --graph-process --sizes "$ANATOMY_SIZES" --batches "$ANATOMY_BATCHES" --repeats "$ANATOMY_BATCHES"
step pass-anatomy-traced 300 $PY benchmarks/pass_anatomy.py --model span-conll03 --data "$DATA/conll03" \
  --device "$DEVICE" --traced-heads --sizes "$ANATOMY_SIZES" --batches "$ANATOMY_BATCHES" --repeats "$ANATOMY_BATCHES"
step pass-anatomy-compiled 300 $PY benchmarks/pass_anatomy.py --model span-conll03 --data "$DATA/conll03" \
  --device "$DEVICE" --compiled-heads --sizes "$ANATOMY_SIZES" --batches "$ANATOMY_BATCHES" --repeats "$ANATOMY_BATCHES"
if todo served-span-graphs-switch && serve span-graphs-switch span-conll03 eager --http-workers "$HTTP_WORKERS" \
  "$REPLAYED" --interpreter-switch-ms 0.05; then
  served span-graphs-switch span-conll03 "$LEVELS" 1
  stop
fi
# the comparisons measured before (H200, 37dd7c2), again: the plain program (--no-cuda-graphs) in the
# service's layout (serve() pins one worker, so the default count is named here); the batch-1 server;
# TorchScript offline
if todo served-span-workers-1 served-span-workers-32 \
  && serve span-workers span-conll03 eager --http-workers "$HTTP_WORKERS" --no-cuda-graphs; then
  served span-workers-1 span-conll03 "$LEVELS" 1
  served span-workers-32 span-conll03 16 32
  nvidia-smi --query-compute-apps=pid,used_memory --format=csv > "$OUT/gpu-memory-span.csv" 2>&1
  stop
fi
if todo served-span-batch1 && serve span-batch1 span-conll03 eager --max-batch-size 1; then served span-batch1 span-conll03 64 1; stop; fi
step offline-torchscript-span-conll03 300 $PY benchmarks/batching_ceiling.py --model span-conll03 \
  --data "$DATA/conll03" --runtime torchscript --device "$DEVICE" --sizes "1,$SIZES" --limit "$LIMIT" --json
onnx_explained
if [ "$DEVICE" != cpu ]; then offline_batch1 span-conll03-half span-conll03 --precision "$HALF" $HALF_GRAPHS_FLAG; fi
# the front in the engine's process
if todo served-span-1 served-span-32 && serve span span-conll03 eager; then
  served span-1 span-conll03 "$LEVELS" 1
  served span-32 span-conll03 16 32
  stop
fi
# two batches in flight, each from a thread (and CUDA stream) of its own: host work beside the device's
step offline-span-conll03-lanes2 300 $PY benchmarks/batching_ceiling.py --model span-conll03 --data "$DATA/conll03" \
  --runtime eager --device "$DEVICE" --sizes "${SIZES#*,}" --limit "$LIMIT" --lanes 2 --json
step profile-span 180 $PY benchmarks/profile_batch.py --model span-conll03 --data "$DATA/conll03" --device "$DEVICE" \
  --sizes "1,${SIZES##*,}"
step profile-span-compiled 180 $PY benchmarks/profile_batch.py --model span-conll03 --data "$DATA/conll03" \
  --device "$DEVICE" --sizes "1,${SIZES##*,}" --compiled-heads
# the same anatomy for the traced graphs, whose operators are dispatched from C++
step pass-anatomy-torchscript 300 $PY benchmarks/pass_anatomy.py --model span-conll03 --data "$DATA/conll03" \
  --device "$DEVICE" --runtime torchscript --sizes "$ANATOMY_SIZES" --batches "$ANATOMY_BATCHES" --repeats "$ANATOMY_BATCHES"
step half-precision 600 $PY benchmarks/half_precision.py --models span-conll03,setgen-conll03 \
  --data "$DATA/conll03" --device "$DEVICE" --precision "$HALF" ${HALF_LIMIT:+--limit "$HALF_LIMIT"}
for model in nag-conll03 setgen-conll03 bartner-conll03; do offline "$model" "$OTHER_LIMIT"; done
offline diffusion-conll03 "$OTHER_LIMIT" --options '{"steps": 1}'
fi
rm -f "$OUT/bars.json"  # the summary is of every step there now, kept or not
step bars 60 $PY benchmarks/gpu_summary.py --folder "$OUT"
cat "$OUT/bars.json" 2>/dev/null
log "done: $OUT"
