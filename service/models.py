"""The models a server runs: graph set (or eager model) + program + options + scheduler each.

Graphs missing at start-up are exported in a subprocess (`python -m nerserve export`): the
service never imports the export or training code, and a failed export is reported, not
half-loaded. Errors here are domain errors (ModelLoadError, OptionError); the API maps them to
HTTP.
"""

from __future__ import annotations

import importlib.util
import logging
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nerserve.ner.archs.base import ArchitectureSpec, ProgramBase
from nerserve.ner.archs.registry import architecture
from nerserve.ner.graph_format import EXPORT_JSON, Runtime
from nerserve.ner.model_store import Manifest, graph_set_folder, list_models, model_dir, read_manifest
from nerserve.ner.text.subword import Tokenized
from nerserve.ner.types import EntitySet
from nerserve.service.batching.packing import BatchLimits
from nerserve.service.batching.scheduler import Scheduler
from nerserve.service.config import Settings
from nerserve.service.metrics import Metrics, ModelObserver
from nerserve.service.pipeline import Planner
from nerserve.service.runtime.graph_set import load_graph_set
from nerserve.service.runtime.memory import release_freed_memory

log = logging.getLogger("nerserve")

# What the batcher carries per sentence: the tokenised sentence (or window) and its options.
Payload = tuple[Tokenized, Any]


class ModelLoadError(RuntimeError):
    pass


@dataclass
class ServedModel:
    name: str
    manifest: Manifest
    spec: ArchitectureSpec[Any, Any]
    program: ProgramBase[Any, Any, Any]
    planner: Planner
    scheduler: Scheduler
    observer: ModelObserver
    runtime: str

    @property
    def defaults(self) -> Any:
        return self.program.config.decode

    def resolve_options(self, raw: dict[str, Any], labels: list[str] | None = None) -> Any:
        """The request's options over the model's defaults, with its labels for an open-label
        model (OptionError names a bad or missing one)."""
        options = self.spec.request_options(self.defaults, raw, labels)
        self.program.check_options(options)
        return options

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
            "scores": {k: v for k, v in manifest.scores.items() if k in ("dev", "test")},
        }


def _ensure_export(name: str, runtime: str) -> Path:
    folder = graph_set_folder(name, runtime)
    if (folder / EXPORT_JSON).is_file():
        return folder
    if importlib.util.find_spec("torch") is None:  # the serving-only install (nerserve[cpu] / [gpu])
        raise ModelLoadError(
            f"{name}: no {runtime} graphs at {folder}, and exporting them needs torch: pip install 'nerserve[export]', "
            "or export where it is installed and point --graph-cache at those graphs"
        )
    log.info("exporting %s to %s (missing at start-up)", name, runtime)
    command = [sys.executable, "-m", "nerserve", "export", name, "--format", runtime]
    completed = subprocess.run(command, check=False, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    if completed.returncode != 0 or not (folder / EXPORT_JSON).is_file():
        lines = [line for line in completed.stderr.splitlines() if line.strip()]
        log.error("export of %s failed:\n%s", name, "\n".join(lines[-20:]))
        reason = lines[-1] if lines else "no message"
        raise ModelLoadError(f"{name}: export to {runtime} failed (exit {completed.returncode}): {reason}")
    return folder


def _program(name: str, settings: Settings) -> tuple[Manifest, ProgramBase[Any, Any, Any]]:
    if settings.runtime == Runtime.eager:
        from nerserve.ner.loading import load_model  # torch only here: the eager runtime is for debugging

        loaded = load_model(name, settings.device)
        return loaded.manifest, loaded.program
    folder = graph_set_folder(name, settings.runtime.value)
    if not (folder / EXPORT_JSON).is_file():
        if not settings.export_missing:
            raise ModelLoadError(f"{name}: no {settings.runtime.value} export at {folder}")
        folder = _ensure_export(name, settings.runtime.value)
    loaded_set = load_graph_set(folder, settings.device, settings.threads)
    return loaded_set.manifest, loaded_set.program


def load_served_model(name: str, settings: Settings, metrics: Metrics) -> ServedModel:
    folder = model_dir(name)
    spec = architecture(read_manifest(folder).architecture)
    manifest, program = _program(name, settings)
    window = min(settings.window_subwords, program.window_subwords or settings.window_subwords)
    planner = Planner(program.subwords, window, settings.window_overlap_words)
    observer = ModelObserver(metrics, folder.name)

    def prepare(payloads: list[Payload]) -> tuple[Any, list[Any]]:
        return program.prepare([sentence for sentence, _ in payloads]), [options for _, options in payloads]

    def run(prepared: tuple[Any, list[Any]]) -> list[EntitySet]:
        batch, options = prepared
        return program.decode(batch, program.run(batch, options), options)

    limits = BatchLimits(
        settings.max_batch_size,
        settings.max_batch_tokens,
        settings.max_wait_ms,
        settings.max_queue,
        max_request_share=settings.request_share_bound,
        max_queue_seconds=settings.max_queue_seconds,
    )
    scheduler = Scheduler(
        prepare=prepare,
        run=run,
        limits=limits,
        observer=observer,
        on_idle=release_freed_memory,
        padded_tokens=lambda prepared: int(prepared[0].padded_tokens),
    )
    return ServedModel(folder.name, manifest, spec, program, planner, scheduler, observer, settings.runtime.value)


def model_names(settings: Settings) -> list[str]:
    names = settings.models or list_models()
    if not names:
        raise ModelLoadError("no models to serve: the model store is empty")
    return names
