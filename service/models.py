"""The models a server runs: graph set (or eager model) + program + options + scheduler each.

Graphs missing at start-up are exported in a subprocess (`python -m ner export`): the service
never imports the export or training code, and a failed export is reported, not half-loaded.
"""

from __future__ import annotations

import logging
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from ner.archs.registry import ArchitectureSpec, architecture
from ner.model_store import Manifest, graph_set_folder, list_models, model_dir, read_manifest
from service.api.errors import ApiError
from service.batching.packing import BatchLimits
from service.batching.scheduler import Scheduler
from service.config import Runtime, Settings
from service.metrics import Metrics, ModelObserver
from service.pipeline import Planner
from service.runtime.graph_set import EXPORT_JSON, load_graph_set

log = logging.getLogger("nerserve")


class ModelLoadError(RuntimeError):
    pass


@dataclass
class ServedModel:
    name: str
    manifest: Manifest
    spec: ArchitectureSpec
    program: Any
    planner: Planner
    scheduler: Scheduler
    observer: ModelObserver
    runtime: str

    @property
    def defaults(self) -> Any:
        return self.program.config.decode

    def resolve_options(self, raw: dict[str, Any]) -> Any:
        try:
            parsed: BaseModel = self.spec.options.model_validate(raw)
        except ValidationError as error:
            first = error.errors()[0]
            field = ".".join(str(p) for p in ("options", *first["loc"]))
            message = "unknown option" if first["type"] == "extra_forbidden" else first["msg"]
            raise ApiError("invalid_option", f"{field}: {message}", field) from None
        changes = {k: v for k, v in parsed.model_dump().items() if v is not None}
        return self.defaults.replace(**changes) if changes else self.defaults

    def option_defaults(self) -> dict[str, Any]:
        return {name: getattr(self.defaults, name) for name in self.spec.options.model_fields}

    def info(self) -> dict[str, Any]:
        manifest = self.manifest
        return {
            "name": self.name,
            "architecture": manifest.architecture,
            "version": manifest.version,
            "labels": manifest.labels,
            "capabilities": {
                "nested": self.spec.nested,
                "discontinuous": self.spec.discontinuous,
                "open_labels": self.spec.open_labels,
            },
            "options": self.option_defaults(),
            "runtime": self.runtime,
            "scores": {k: v for k, v in manifest.scores.items() if k in ("dev", "test")},
        }


def _ensure_export(name: str, runtime: str) -> Path:
    folder = graph_set_folder(name, runtime)
    if (folder / EXPORT_JSON).is_file():
        return folder
    log.info("exporting %s to %s (missing at start-up)", name, runtime)
    command = [sys.executable, "-m", "ner", "export", name, "--format", runtime]
    completed = subprocess.run(command, check=False, stderr=None, stdout=subprocess.DEVNULL)
    if completed.returncode != 0 or not (folder / EXPORT_JSON).is_file():
        raise ModelLoadError(f"{name}: export to {runtime} failed (exit {completed.returncode})")
    return folder


def _program(name: str, settings: Settings) -> tuple[Manifest, Any]:
    if settings.runtime == Runtime.eager:
        from ner.loading import load_model  # torch only here: the eager runtime is for debugging

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
    planner = Planner(program.subwords.tokenizer, settings.window_subwords, settings.window_overlap_words)
    observer = ModelObserver(metrics, folder.name)

    def prepare(payloads: list[tuple[list[str], Any]]) -> tuple[Any, list[Any]]:
        return program.prepare([words for words, _ in payloads]), [options for _, options in payloads]

    def run(prepared: tuple[Any, list[Any]]) -> list[Any]:
        batch, options = prepared
        return list(program.decode(batch, program.run(batch, options), options))

    limits = BatchLimits(
        settings.max_batch_size,
        settings.max_batch_tokens,
        settings.max_wait_ms,
        settings.max_queue,
        max_padding=settings.max_padding,
    )
    scheduler = Scheduler(prepare=prepare, run=run, limits=limits, observer=observer)
    return ServedModel(folder.name, manifest, spec, program, planner, scheduler, observer, settings.runtime.value)


def model_names(settings: Settings) -> list[str]:
    names = settings.models or list_models()
    if not names:
        raise ModelLoadError("no models to serve: the model store is empty")
    return names
