"""Service settings: every `nerserve serve` flag is also an environment variable (NERSERVE_*)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import NoDecode, SettingsConfigDict

from nerserve.ner.graph_format import Runtime
from nerserve.ner.model_store import Locations
from nerserve.service.interpreter import DEFAULT_SWITCH_MS
from nerserve.service.logs import LogFormat

# On CPU a batch holds at most this many sub-words of one request (its first item excepted): fewer
# than a window of a long text, so a window runs only in a batch it heads. A batch runs hardly
# faster a sub-word on the CPU than its sentences alone, so a large request gains little from full
# batches, while a request that arrives beside it waits for the batch running and the one prepared
# behind it, then its own: a large request's batches must stay short, and a newcomer's batch must
# not carry a window, for that wait to stay short (docs/decisions/admission.md).
CPU_MAX_REQUEST_TOKENS = 256
# Batch bounds by device: on the CPU a batch gains little beyond a few dozen sentences and a larger
# one only holds newcomers longer; a GPU's throughput keeps rising to hundreds (docs/gpu.md).
CPU_MAX_BATCH_SIZE, CPU_MAX_BATCH_TOKENS = 32, 8192
CUDA_MAX_BATCH_SIZE, CUDA_MAX_BATCH_TOKENS = 256, 65536
# ONNX Runtime on the CPU runs two batches on one core each faster than one batch on two cores
# (docs/decisions/graph-lanes.md): by default two lanes where there are two cores. OpenVINO ran
# about as fast either way, and takes the same default (docs/decisions/cpu-inference.md).
CPU_GRAPH_LANES = 2
CPU_LANED_RUNTIMES = (Runtime.onnx, Runtime.openvino)
DEVICE_GRAPH_LANES = 2
# A fast device is fed by several HTTP processes: one front process answers 1,200-1,600 one-sentence
# requests a second a core, a fraction of what a GPU computes (docs/gpu.md). By default, on CUDA,
# every usable core but the engine's two (its event loop, prepare and decode), at most 8.
ENGINE_CORES, MAX_DEFAULT_HTTP_WORKERS = 2, 8
# How long a pass may run before the device is taken to hang (and ten times its expected time).
# A GPU's passes take milliseconds: a minute is a hang, found soon enough for a restart to matter.
# On the CPU a slow model's batch at its limits takes tens of seconds (gliner, 32 sentences of 256
# sub-words: 33 s on one core of this 2-core machine), and a slower machine may double that.
GPU_PASS_TIMEOUT_SECONDS, CPU_PASS_TIMEOUT_SECONDS = 60.0, 600.0


# a container's CPU limit (cgroup v2): "max 100000", or "200000 100000" for two CPUs
CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")


def usable_cores() -> int:
    """The cores this process may run on: those taskset or a cpuset allow, fewer where a container's
    CPU limit (a Kubernetes `limits.cpu`) allows less time than that, whole CPUs of it."""
    cores = len(os.sched_getaffinity(0))
    try:
        quota, period = CGROUP_CPU_MAX.read_text().split()[:2]
        limit = int(quota) // int(period)
    except (OSError, ValueError):  # no cgroup v2 limit here, or "max": the cores themselves
        return cores
    return max(1, min(cores, limit))


def machine_cores() -> int:
    """Every core of the machine, as a runtime that ignores taskset and CPU limits counts them."""
    return os.cpu_count() or 1


class Settings(Locations):
    """The server's settings; the model store, graph cache and data root are the `Locations` ones."""

    model_config = SettingsConfigDict(env_prefix="NERSERVE_", extra="ignore")

    models: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="models to serve (NERSERVE_MODELS=a,b); empty = every model in the store"
    )
    default_model: str | None = Field(
        "span-conll03", description="model for requests that name none (the first served model if it is not served)"
    )
    host: str = Field(
        "127.0.0.1",
        description="address to listen on (0.0.0.0: every IPv4 interface; '::': every interface, IPv6 and IPv4)",
    )
    port: int = Field(8000, ge=0, le=65535, description="port to listen on")
    runtime: Runtime = Field(
        Runtime.onnx,
        description="how graphs run: exported ONNX (through ONNX Runtime, or through OpenVINO on the CPU: "
        "openvino, with nerserve[openvino]) or TorchScript, or eager torch (on CUDA the GPU path: docs/gpu.md; on "
        "the CPU for debugging)",
    )
    device: str = Field(
        "cpu",
        description="cpu, cuda[:N] (the process exits at once, saying why, where CUDA cannot be used), auto "
        "(CUDA where it works, else the CPU) or simulated (a measured GPU's batch costs waited on the CPU, to "
        "measure the engine around the device; zeros for outputs)",
    )
    simulated_device_costs: Path | None = Field(
        None,
        description="--device simulated: a JSON table of batch costs by sub-words, a file or a bundled table's name "
        "(default: h100-minilm-l6.json, the bare encoder on an H100; h100-span-conll03-offline.json, span-conll03's "
        "batches there); its figures are simulated, never GPU figures",
    )
    precision: Literal["fp32", "fp16", "bf16"] = Field(
        "fp32",
        description="fp16 or bf16: the model's weights converted to it once at load, and its graphs run in it "
        "(eager runtime on CUDA: docs/gpu.md has the entity-set agreement and F1 each reached against fp32); bf16 "
        "with the openvino runtime on a CPU with bf16 instructions: on one with AMX fp32's F1 at 1.5 times fp32's "
        "sentences a second under load, below --int8's (docs/decisions/cpu-inference.md)",
    )
    int8: bool = Field(
        False,
        description="serve each model's dynamically INT8-quantised ONNX graphs (exported at start-up where missing, "
        "as fp32's are; refused where their entity sets match fp32's on under half the export's parity sentences): "
        "served on one core 1.4-1.8 times fp32's sentences a second, test F1 0.010 lower than fp32's to 0.004 higher "
        "(docs/decisions/cpu-inference.md); the ONNX runtime on the CPU only",
    )
    cuda_graphs: bool | None = Field(
        None,
        description="the backbone's pass replayed from CUDA graphs captured at load, one per bucket of batch shapes "
        "(eager runtime on CUDA only): a small batch's kernels launched at once instead of one by one from Python; "
        "default: on for the eager runtime on CUDA in fp32, where its entity sets matched the plain pass's on a GPU "
        "(docs/gpu.md), off in half precision (not yet compared there)",
    )
    graph_process: bool = Field(
        False,
        description="run each model's graphs in a process of its own (a thread a graph lane there), so that a "
        "runtime whose operators release the interpreter lock one by one (eager torch on CUDA) does not wait to get "
        "it back from the engine's event loop, prepare and decode (docs/decisions/gpu-engine.md; two lanes not yet "
        "timed on a GPU)",
    )
    graph_processes: int = Field(
        1,
        ge=1,
        le=8,
        description="with graph_process: the processes each model's graph lanes are dealt out over (default lanes: "
        "as many as these, two at least), each an interpreter of its own (a CUDA context of its own on a GPU), so "
        "that eager passes bound by Python launching their kernels are launched side by side rather than one "
        "interpreter lock's turn at a time (docs/decisions/gpu-engine.md; not yet timed on a GPU)",
    )
    traced_heads: bool = Field(
        False,
        description="the eager runtime's graphs, all but the backbone, traced to TorchScript at load and checked "
        "against the eager ones there: a pass then takes the interpreter lock a few times rather than at each of "
        "its ~130 operators, each of which may wait a switch interval for it beside a busy thread "
        "(docs/decisions/gpu-engine.md; not yet timed on a GPU)",
    )
    compiled_heads: bool = Field(
        False,
        description="the eager runtime's graphs, all but the backbone and the BiLSTM, compiled by torch.compile at "
        "load (for dynamic shapes) and checked against the eager ones there: a pass launches a few fused kernels "
        "rather than each operator from Python, which on a GPU is most of a small batch's time. Needs Triton on a "
        "GPU, a C++ compiler on the CPU; a few seconds more a model to start (docs/decisions/gpu-engine.md; not yet "
        "timed on a GPU)",
    )
    interpreter_switch_ms: float = Field(
        DEFAULT_SWITCH_MS,
        gt=0,
        le=100,
        description="how soon a thread waiting for the interpreter lock asks for it, in every process of the server "
        "(Python's switch interval, 5 ms by default): a graph lane of eager torch releases the lock at every "
        "operator and, beside a thread running Python, waits up to this long to get it back each time "
        "(docs/decisions/gpu-engine.md)",
    )
    http_workers: int | None = Field(
        None,
        ge=1,
        description="HTTP worker processes in front of one engine process (parsing, validation and JSON off the "
        "engine's interpreter lock); 1: the front and the engine share one process (default: 1 on the CPU; on "
        f"CUDA the usable cores but {ENGINE_CORES}, 1 to {MAX_DEFAULT_HTTP_WORKERS})",
    )
    threads: int | None = Field(
        None, ge=1, description="intra-op threads per graph (default: the cores this process may use, shared by the lanes)"
    )
    graph_lanes: int | None = Field(
        None,
        ge=1,
        le=8,
        description="batches of one model the graphs run at once, each from a thread of its own on one shared "
        "session, the cores split among them; default 2 for ONNX graphs on a CPU of two or more cores (ONNX "
        "Runtime gains less from a second core within one batch than from a second batch) and 2 on a GPU or the "
        "simulated device behind HTTP worker processes (the next pass launched while one runs), else 1 "
        "(docs/decisions/graph-lanes.md)",
    )
    max_batch_size: int | None = Field(
        None, ge=1, description="most sentences in one batch of the graphs; default 32 on CPU, 256 on CUDA"
    )
    max_batch_tokens: int | None = Field(
        None, ge=16, description="most sub-words in one batch of the graphs; default 8192 on CPU, 65536 on CUDA"
    )
    max_wait_ms: float = Field(
        5.0,
        ge=0,
        description="how long a batch that is not full waits for more sentences while the graphs are busy "
        "(on idle graphs it closes at once, but on a device whose pass costs mostly its launches, where it waits "
        "up to this long, and a pass, for the rest of a closed loop's clients)",
    )
    max_queue: int = Field(2048, ge=1, description="sentences waiting per model before 429")
    max_queue_seconds: float = Field(
        1.0,
        gt=0,
        description="429 at once for a request whose estimated wait on others' work (what is ahead of it in fair "
        "order ÷ the sub-words/s measured for batches of the size they would form) exceeds it; an admitted request "
        "is answered within about twice this under 3× overload (docs/decisions/admission.md)",
    )
    max_request_tokens: int | None = Field(
        None,
        ge=1,
        description="most sub-words of one request in a batch (a batch's first item goes whatever its size); default "
        "256 on CPU (a batch is hardly cheaper a sub-word there, and a large request's long batches would hold up "
        "everyone else) and none on CUDA",
    )
    fair_quantum: int = Field(
        1,
        ge=1,
        description="sentences of one request a round of the fair order. With 1, a one-sentence request goes in the "
        "next batch, and equal requests that arrive together all finish after their last batch; more lets the first "
        "of them finish sooner, while a newcomer waits behind up to this many sentences of each request of its "
        "round (docs/decisions/admission.md)",
    )
    max_texts: int = Field(256, ge=1, description="texts (or token lists) per request")
    max_request_sentences: int = Field(
        1024,
        ge=1,
        description="sentences (and windows of long ones) one request may queue; more is a 413 at once, since "
        "such a request could hold the graphs for many seconds",
    )
    max_body_bytes: int = Field(
        2_000_000, ge=1024, description="largest request body (a compressed one: once decompressed); more is a 413"
    )
    window_subwords: int = Field(384, ge=32, description="long sentences are windowed to this many sub-words")
    window_overlap_words: int = Field(24, ge=0, description="words two windows of a long sentence share")
    drain_seconds: float = Field(30.0, ge=0, description="on SIGTERM, how long admitted requests may take to finish")
    pass_timeout_seconds: float | None = Field(
        None,
        ge=0,
        description="a pass on a model's graphs still running after this long, and ten times its expected time, "
        "means the device or graph process hangs: its sentences are answered 503 and the model is broken "
        f"(see on_model_error); 0: never; by default {GPU_PASS_TIMEOUT_SECONDS:g} s on a GPU, "
        f"{CPU_PASS_TIMEOUT_SECONDS:g} s on the CPU",
    )
    batch_log: Path | None = Field(
        None,
        description="a JSON line per batch appended to this file: when it closed and why, was handed to the graph "
        "lanes, taken by one, ran and was answered (monotonic seconds), its pass on the lane's clock and on the "
        "device's where it has one, its sentences, sub-words and lane; for "
        "tuning batching on a device, where /metrics gives a level's averages only",
    )
    access_log: bool = Field(
        False,
        description="a log line per request: method, path, status, milliseconds, model, API key's name and request "
        "id; off by default: /metrics counts every response by model and status, and a line per request costs "
        "the event loop time under load",
    )
    log_format: LogFormat = Field(
        "text",
        description="the log lines of every process of the server (uvicorn's too): text, or json (one object a "
        "line: time, level, logger, process, message, and an access line's fields) for a log collector",
    )
    header_timeout_seconds: float = Field(
        10.0, gt=0, description="a request whose line and headers take longer to arrive gets a 408 and is closed"
    )
    warm_up_at_batch_limits: bool | None = Field(
        None,
        description="before a model reports ready, run a full batch at the batch limits through its graphs, after the "
        "one sentence every model runs first, so that limits the device's memory cannot hold stop the start-up, "
        "naming them, instead of failing batches under load; its time, with the lone sentence's, is admission's "
        "first estimate; default: on CUDA and the simulated device",
    )
    export_missing: bool = Field(True, description="export graphs missing at start-up (in child processes)")
    load_before_serving: bool = Field(
        False,
        description="load every model before the app starts answering (a Ray Serve replica: the router sends it "
        "requests only once its start-up is over); otherwise the default model answers while the others load",
    )
    api_keys: SecretStr | None = Field(
        None,
        description="API keys as JSON, {name: key} or {name: {key, weight, max_sentences_per_second}} "
        "(NERSERVE_API_KEYS; never a command-line flag, which `ps` would show); none: every route is open",
    )
    api_keys_file: Path | None = Field(None, description="a file holding the API keys' JSON (a mounted secret)")
    protect_metrics: bool = Field(False, description="/metrics asks for an API key too (health and /info never do)")
    cors_allow_origins: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="origins browsers may call from (NERSERVE_CORS_ALLOW_ORIGINS=a,b); none by default"
    )
    on_model_error: Literal["exit", "skip"] = Field(
        "exit",
        description="a model that cannot load, or whose graphs stop working while it serves (a graph process gone, "
        "a device in an error state), ends the process with a non-zero exit naming it (exit), or is listed as "
        "failed or broken in GET /models and answered 503 while the others serve (skip; with none left, it exits)",
    )

    @property
    def locations(self) -> Locations:
        """The folders alone, for the processes the server starts (no key or other setting with them)."""
        return Locations(model_store=self.model_store, graph_cache=self.graph_cache, data_root=self.data_root)

    @field_validator("models", "cors_allow_origins", mode="before")
    @classmethod
    def comma_list(cls, value: object) -> object:
        """`a,b` (or a JSON list, as before) from the environment."""
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                return json.loads(text)
            return [name.strip() for name in text.split(",") if name.strip()]
        return value

    @model_validator(mode="after")
    def a_request_fits_the_queue(self) -> Settings:
        if self.max_request_sentences > self.max_queue:
            raise ValueError(
                f"max_request_sentences ({self.max_request_sentences}) must not exceed max_queue ({self.max_queue}): "
                "a larger request could never be queued"
            )
        return self

    @model_validator(mode="after")
    def eager_cuda_options_on_eager_cuda(self) -> Settings:
        """Half precision and CUDA graphs are the eager runtime's on CUDA (a capture needs a GPU;
        ONNX Runtime's and TorchScript's graphs keep the trained precision), but for bf16, which
        OpenVINO also computes in on the CPU."""
        openvino_bf16 = self.runtime == Runtime.openvino and self.precision == "bf16"
        asked = [f"precision {self.precision}"] if self.precision != "fp32" and not openvino_bf16 else []
        asked += ["cuda_graphs"] if self.cuda_graphs else []
        if asked and (self.runtime != Runtime.eager or not self.device.startswith("cuda")):
            raise ValueError(
                f"{' and '.join(asked)} {'run' if len(asked) > 1 else 'runs'} on CUDA with the eager runtime only "
                f"(asked for runtime {self.runtime.value} on device {self.device})"
            )
        return self

    @model_validator(mode="after")
    def int8_on_the_cpu(self) -> Settings:
        """The quantised graphs are ONNX Runtime's CPU kernels (its INT8 LSTMs have no others): on a
        GPU they would run partly on the CPU beside it, unmeasured."""
        if self.int8 and (self.runtime != Runtime.onnx or self.device != "cpu"):
            raise ValueError(
                f"int8 serves ONNX graphs on the CPU only (asked for runtime {self.runtime.value} on device {self.device}; "
                "--device cpu --runtime onnx; --runtime openvino --precision bf16 is faster than fp32 at fp32's F1 "
                "where the CPU has AMX)"
            )
        return self

    @property
    def graph_format(self) -> str:
        """The exported graphs the runtime serves (the eager runtime's modules have none)."""
        fmt = self.runtime.graph_format
        if fmt is None:
            raise ValueError("the eager runtime serves no exported graphs")
        return fmt.value

    @property
    def served_precision(self) -> str:
        """What the graphs compute in, as /info reports it."""
        return "int8" if self.int8 else self.precision

    @model_validator(mode="after")
    def graph_processes_with_a_graph_process(self) -> Settings:
        if self.graph_processes > 1 and not self.graph_process:
            raise ValueError(
                f"graph_processes {self.graph_processes} needs graph_process (the graphs in processes of their own)"
            )
        if self.graph_processes > self.lanes:
            raise ValueError(
                f"graph_processes {self.graph_processes} for graph_lanes {self.lanes}: each graph process runs one lane or more"
            )
        return self

    @model_validator(mode="after")
    def traced_heads_on_eager(self) -> Settings:
        if self.traced_heads and self.runtime != Runtime.eager:
            raise ValueError(f"traced_heads traces the eager runtime's graphs (asked for runtime {self.runtime.value})")
        if self.compiled_heads and self.runtime != Runtime.eager:
            raise ValueError(f"compiled_heads compiles the eager runtime's graphs (asked for runtime {self.runtime.value})")
        if self.compiled_heads and self.traced_heads:
            raise ValueError("a model's heads are traced (traced_heads) or compiled (compiled_heads), not both")
        return self

    @property
    def replays_cuda_graphs(self) -> bool:
        """`cuda_graphs`, or its default: on for fp32 eager on CUDA (exact and faster at every served load
        measured, for a few GiB of device memory: docs/gpu.md)."""
        if self.cuda_graphs is not None:
            return self.cuda_graphs
        return self.runtime == Runtime.eager and self.device.startswith("cuda") and self.precision == "fp32"

    @property
    def lanes(self) -> int:
        """`graph_lanes`, or its default for where the graphs run. On a device with the HTTP front in
        worker processes, two: the next pass is launched while one runs, and the device takes it the
        moment that one ends (in a graph process too: a thread a lane there). With the front in the
        engine's own loop, one: there the loop is the limit, and a second lane's launches only cut
        the batches smaller (docs/decisions/graph-lanes.md)."""
        if self.graph_lanes is not None:
            return self.graph_lanes
        if self.graph_processes > 1:
            return max(DEVICE_GRAPH_LANES, self.graph_processes)
        if self.batches_as_gpu:
            return DEVICE_GRAPH_LANES if self.front_workers > 1 else 1
        cpu_graphs = self.device == "cpu" and self.runtime in CPU_LANED_RUNTIMES and not self.graph_process
        return CPU_GRAPH_LANES if cpu_graphs and usable_cores() >= CPU_GRAPH_LANES else 1

    @property
    def front_workers(self) -> int:
        """`http_workers`, or its default for the device: a GPU's (or the simulated device's)
        answers outrun one front process."""
        if self.http_workers is not None:
            return self.http_workers
        if not self.batches_as_gpu:
            return 1
        return max(1, min(MAX_DEFAULT_HTTP_WORKERS, usable_cores() - ENGINE_CORES))

    @property
    def graph_threads(self) -> int | None:
        """Intra-op threads per graph: `threads`, or the usable cores shared among the lanes. None
        (the runtime's own default) only for one lane on a process that may use every core of the
        machine: ONNX Runtime sizes its pool by the machine's cores, whatever taskset, a cpuset or a
        container's CPU limit allows, and pins a thread to each of them (out of a taskset's mask, or
        refused by a cpuset), so that a pod of one CPU on a many-core node would split each operator
        among as many threads as the node has cores, all taking turns on that one CPU."""
        if self.threads is not None:
            return self.threads
        cores = usable_cores()
        if self.lanes == 1 and cores == machine_cores():
            return None
        return max(1, cores // self.lanes)

    @property
    def warms_up_at_batch_limits(self) -> bool:
        if self.warm_up_at_batch_limits is not None:
            return self.warm_up_at_batch_limits
        return self.batches_as_gpu

    @property
    def pass_timeout(self) -> float | None:
        """`pass_timeout_seconds`, or its default for the device; None: passes are not watched."""
        if self.pass_timeout_seconds is not None:
            return self.pass_timeout_seconds or None
        return GPU_PASS_TIMEOUT_SECONDS if self.batches_as_gpu else CPU_PASS_TIMEOUT_SECONDS

    @property
    def batches_as_gpu(self) -> bool:
        """CUDA, or the simulated device that stands in for it (batch bounds and dispatch as a GPU's)."""
        return self.device.startswith("cuda") or self.device == "simulated"

    @property
    def batch_size_bound(self) -> int:
        """A GPU runs hundreds of sentences in the time the CPU runs a few: its batches are larger."""
        if self.max_batch_size is not None:
            return self.max_batch_size
        return CUDA_MAX_BATCH_SIZE if self.batches_as_gpu else CPU_MAX_BATCH_SIZE

    @property
    def batch_tokens_bound(self) -> int:
        if self.max_batch_tokens is not None:
            return self.max_batch_tokens
        return CUDA_MAX_BATCH_TOKENS if self.batches_as_gpu else CPU_MAX_BATCH_TOKENS

    @property
    def close_as_device_frees(self) -> bool:
        """A GPU's batch costs little more for many more sentences (the H100's span-conll03 pass:
        21 ms for 128, 29 ms for 256), so while one batch runs the next keeps gathering until the
        device is about to take it, instead of closing at max_wait into a third small batch
        (docs/decisions/gpu-engine.md). Not on the CPU: there a batch costs about its sentences,
        and its lanes take batches as they free."""
        return self.batches_as_gpu

    @property
    def request_tokens_bound(self) -> int | None:
        if self.max_request_tokens is not None:
            return self.max_request_tokens
        return None if self.batches_as_gpu else CPU_MAX_REQUEST_TOKENS
