"""The models a server runs: graph set (or eager model) + program + options + scheduler each.

Graphs missing at start-up are exported by service.start_up_exports (what `nerserve export` does,
with a shorter parity check): a failed export is reported, not half-loaded. Errors here are domain
errors (ModelLoadError, OptionError); the API maps them to HTTP.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nerserve.ner.archs.base import ArchitectureSpec, ProgramBase
from nerserve.ner.archs.registry import architecture
from nerserve.ner.backbone import resolve_backbone
from nerserve.ner.graph import execution_providers
from nerserve.ner.graph_format import EXPORT_JSON, Runtime, int8_refusal, read_export_info
from nerserve.ner.model_store import Locations, Manifest, read_manifest
from nerserve.ner.runtime import lane_stream, pass_clock
from nerserve.ner.runtime.graph_set import load_graph_set
from nerserve.service.batch_log import BatchLog
from nerserve.service.batch_passes import BatchPasses, PreparedGroups
from nerserve.service.batching.packing import BatchLimits
from nerserve.service.batching.scheduler import Scheduler
from nerserve.service.config import Settings
from nerserve.service.graph_process import GraphProcess
from nerserve.service.memory import release_freed_memory
from nerserve.service.metrics import Metrics, ModelObserver
from nerserve.service.pipeline import Planner, PlanningRule
from nerserve.service.start_up_exports import ModelLoadError, StartUpExports
from nerserve.service.warm_up import FullBatch, WarmUp, known_good_payload, warm_up

log = logging.getLogger("nerserve")

# an open-label model's labels for its warm-up passes, where its manifest names none
WARM_UP_LABELS = ("person", "organization", "location")


@dataclass(frozen=True)
class ModelView:
    """What the HTTP layer shows of a loaded model (GET /models, /info, the v2 metadata): made once
    when it loads, and sent as is to the HTTP worker processes."""

    name: str
    version: str
    architecture: str
    labels: list[str]
    info: dict[str, Any]
    planning: PlanningRule  # an HTTP worker plans this model's requests itself


@dataclass
class ServedModel:
    name: str
    manifest: Manifest
    spec: ArchitectureSpec[Any, Any]
    program: ProgramBase[Any, Any, Any]
    planning: PlanningRule
    planner: Planner
    scheduler: Scheduler
    observer: ModelObserver
    runtime: str
    graphs: GraphProcess | None = None  # the process running the graphs, with --graph-process
    warmed_up: WarmUp | None = None
    precision: str = "fp32"  # what its graphs compute in: fp32, fp16, bf16 or int8

    @property
    def execution_providers(self) -> dict[str, str]:
        """What each graph actually runs on (in the graph process, where there is one)."""
        return self.graphs.execution_providers if self.graphs else execution_providers(self.program.graphs)

    def close(self) -> None:
        """After the scheduler has stopped: the graph process, if any, ends (at once if the model
        is broken: a child that hangs would not read the request to stop)."""
        if self.graphs is not None:
            self.graphs.close(wait=0.0 if self.scheduler.broken else 10.0)

    @property
    def defaults(self) -> Any:
        return self.program.config.decode

    def resolve_options(self, raw: dict[str, Any], labels: list[str] | None = None) -> Any:
        """The request's options over the model's defaults, with its labels for an open-label
        model (OptionError names a bad or missing one)."""
        options = self.spec.request_options(self.defaults, raw, labels)
        self.program.check_options(options)
        return options

    def view(self) -> ModelView:
        manifest = self.manifest
        return ModelView(self.name, manifest.version, manifest.architecture, list(manifest.labels), self.info(), self.planning)

    def info(self) -> dict[str, Any]:
        manifest = self.manifest
        capabilities = self.spec.capabilities
        return {
            "name": self.name,
            "architecture": manifest.architecture,
            "version": manifest.version,
            "labels": manifest.labels,
            "capabilities": {
                "nested": capabilities.nested,
                "discontinuous": capabilities.discontinuous,
                "open_labels": capabilities.open_labels,
                "autoregressive": capabilities.autoregressive,
            },
            "options": self.spec.option_defaults(self.defaults),
            "runtime": self.runtime,
            "precision": self.precision,
            "execution_providers": self.execution_providers,
            "warm_up": self.warmed_up.as_dict() if self.warmed_up else None,
            "scores": {k: v for k, v in manifest.scores.items() if k in ("dev", "test")},
            "words": manifest.words.model_dump(),
        }


@dataclass(frozen=True)
class GraphSource:
    """Where a model's graphs load from, on which device: what a graph process needs to load them
    itself (picklable; the process is spawned)."""

    runtime: Runtime
    folder: Path  # the model's folder (eager) or its graph set's
    device: str
    threads: int | None = None
    precision: str = "fp32"
    simulated_device_costs: Path | None = None
    cuda_graphs: bool = False
    traced_heads: bool = False
    compiled_heads: bool = False
    lanes: int = 1  # batches run at once (OpenVINO compiles a stream for each)

    def load(self, device: str | None = None) -> tuple[Manifest, ProgramBase[Any, Any, Any]]:
        on = device or self.device
        if self.runtime == Runtime.eager:
            from nerserve.ner.loading import load_model  # torch only here: the eager runtime (on CUDA the GPU path)

            on_own_device = on == self.device  # not this process's CPU copy beside a graph process
            loaded = load_model(
                self.folder,
                on,
                precision=self.precision if on_own_device else "fp32",
                merged=True,
                cuda_graphs=self.cuda_graphs and on_own_device,
                traced_heads=self.traced_heads and on_own_device,
                compiled_heads=self.compiled_heads and on_own_device,
            )
            return loaded.manifest, loaded.program
        loaded_set = load_graph_set(
            self.folder, on, self.threads, self.simulated_device_costs, self.runtime, self.precision, self.lanes
        )
        return loaded_set.manifest, loaded_set.program

    def program(self) -> ProgramBase[Any, Any, Any]:
        return self.load()[1]

    def tokenizer_folder(self, manifest: Manifest) -> Path:
        """Where the program's tokenizer is read from: a graph set carries its own; the eager
        runtime reads the backbone's."""
        if self.runtime == Runtime.eager:
            return resolve_backbone(manifest.backbone.name).path
        return self.folder


def _graph_source(name: str, settings: Settings, background: bool, exports: StartUpExports) -> GraphSource:
    if settings.runtime == Runtime.eager:
        folder = settings.model_dir(name)
    else:
        fmt = settings.graph_format
        folder = settings.graph_set_folder(name, fmt, settings.int8)
        if not (folder / EXPORT_JSON).is_file():
            if not settings.export_missing:
                kind = f"{fmt} (INT8)" if settings.int8 else fmt
                raise ModelLoadError(f"{name}: no {kind} export at {folder}")
            folder = exports.run(name, fmt, background, settings.int8)
        if settings.int8 and (refusal := int8_refusal(read_export_info(folder))) is not None:
            raise ModelLoadError(f"{name}: {refusal}")
    return GraphSource(
        settings.runtime,
        folder,
        settings.device,
        settings.graph_threads,
        settings.precision,
        settings.simulated_device_costs,
        settings.replays_cuda_graphs,
        settings.traced_heads,
        settings.compiled_heads,
        settings.lanes,
    )


def load_served_model(
    name: str,
    settings: Settings,
    metrics: Metrics,
    exports: StartUpExports,
    background: bool = False,
    tenant_weight: Callable[[str], float] = lambda tenant: 1.0,
    on_broken: Callable[[str], None] | None = None,
    batch_log: BatchLog | None = None,
) -> ServedModel:
    """`background`: another model already answers (a missing export runs at a lower priority);
    `on_broken`, told why if its graphs stop working while it serves (Scheduler.probe)."""
    folder = settings.model_dir(name)
    spec = architecture(read_manifest(folder).architecture)
    source = _graph_source(name, settings, background, exports)
    graphs = (
        GraphProcess(
            name,
            source.program,
            settings.lanes,
            _lane_stream(settings),
            settings.interpreter_switch_ms,
            functools.partial(pass_clock, settings.runtime.value, settings.device),
            settings.graph_processes,
        )
        if settings.graph_process
        else None
    )
    # with a graph process, this process's own program only prepares and decodes: it loads on the CPU
    manifest, program = source.load("cpu" if graphs else None)
    window = min(settings.window_subwords, program.window_subwords or settings.window_subwords)
    planning = PlanningRule.of(source.tokenizer_folder(manifest), window, settings.window_overlap_words, manifest.words)
    planner = planning.planner(program.subwords)
    observer = ModelObserver(metrics, folder.name, batch_log)

    stages = BatchPasses(program, graphs, in_length_groups=not settings.batches_as_gpu)
    limits = BatchLimits(
        settings.batch_size_bound,
        settings.batch_tokens_bound,
        settings.max_wait_ms,
        settings.max_queue,
        max_request_tokens=settings.request_tokens_bound,
        max_queue_seconds=settings.max_queue_seconds,
        close_when_idle=True,
        close_as_device_frees=settings.close_as_device_frees,
    )
    scheduler = Scheduler(
        prepare=stages.prepare,
        run=stages.run,
        finish=stages.decode,
        limits=limits,
        observer=observer,
        on_idle=release_freed_memory,
        padded_tokens=PreparedGroups.padded_tokens,
        tenant_weight=tenant_weight,
        fair_quantum=settings.fair_quantum,
        answer_per_turn=settings.front_workers == 1,
        lanes=settings.lanes,
        lane_setup=None if graphs else _lane_stream(settings),  # a graph process's lanes take their streams there
        pass_clock=graphs.pass_clock if graphs else pass_clock(settings.runtime.value, settings.device),
        lanes_drive_a_device=settings.batches_as_gpu,
        on_broken=on_broken,
        pass_timeout=settings.pass_timeout,
    )
    served = ServedModel(
        folder.name,
        manifest,
        spec,
        program,
        planning,
        planner,
        scheduler,
        observer,
        settings.runtime.value,
        graphs,
        precision=settings.served_precision,
    )

    full_batch = FullBatch(settings.batch_size_bound, settings.batch_tokens_bound, window)
    options = _warm_up_options(served)
    served.warmed_up = warm_up(
        served.name,
        stages.in_turn,
        program.subwords,
        options,
        full_batch if settings.warms_up_at_batch_limits else None,
        rounds=graphs.processes if graphs else 1,
    )
    log.info("%s: warmed up %s", served.name, served.warmed_up.as_dict())
    # answered now: after a failed batch, whether the model still works
    scheduler.probe = functools.partial(stages.in_turn, [known_good_payload(program.subwords, options)])
    scheduler.estimate.first_estimate(served.warmed_up.passes())
    for graph, provider in served.execution_providers.items():
        metrics.graph_provider.labels(served.name, graph, provider).set(1)
    return served


def _warm_up_options(served: ServedModel) -> Any:
    """The model's default options; for an open-label model, its manifest's labels (or three common ones)."""
    labels = list(served.manifest.labels) or list(WARM_UP_LABELS)
    return served.resolve_options({}, labels if served.spec.capabilities.open_labels else None)


def _lane_stream(settings: Settings) -> Callable[[], None] | None:
    """With several lanes, each lane's thread launches on a stream of its own where the runtime needs one."""
    return None if settings.lanes == 1 else lane_stream(settings.runtime.value, settings.device)


def decoder_loop_length(name: str, locations: Locations) -> int:
    """How long a model's decoder loops run: 0 without a loop, 1 a few steps an entity, 2 a few
    steps a word."""
    try:
        capabilities = architecture(read_manifest(locations.model_dir(name)).architecture).capabilities
    except Exception:  # an unreadable model fails when it loads, where it is reported
        return 0
    return int(capabilities.autoregressive) + int(capabilities.writes_every_word)


def model_names(settings: Settings) -> list[str]:
    names = settings.models or settings.list_models()
    if not names:
        store = settings.locations.model_store
        why = "is empty" if store.is_dir() else "is not a folder here"
        raise ModelLoadError(f"no models to serve: the model store {store} {why} (--model-store, NERSERVE_MODEL_STORE)")
    return names
