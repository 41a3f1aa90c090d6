"""The wiring the command line (and a Ray Serve config) hands the service: how graphs missing at
start-up are exported. Part of the composition root: the only place where export meets the service.

The exporter's function imports the export code inside the child process that runs it, so the
serving process never loads torch, transformers or peft, and a serving-only install
(`nerserve[cpu]`) never needs them until a graph is actually missing.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

from nerserve.ner.model_store import Locations
from nerserve.service.start_up_exports import Exporter


def _stop_at_once(signum: int, frame: object) -> None:
    """The server is stopping (StartUpExports sends SIGINT): the export ends here and now. Raised
    as KeyboardInterrupt, the signal could land in a finalizer, which swallows it (printing a
    traceback into the server's log) and lets the export run on until it is killed. The server
    removes the staging folder the export reported."""
    os._exit(128 + signum)


def export_at_start_up(
    source: Path, fmt: str, int8: bool, locations: Locations, parity_sentences: int, background: bool, report: Any
) -> None:
    signal.signal(signal.SIGINT, _stop_at_once)
    from nerserve.export.build import export_for_service

    export_for_service(source, fmt, int8, locations, parity_sentences, background, report)


START_UP_EXPORTER = Exporter(run=export_at_start_up, preload=("nerserve.export.build",))


def ray_application(args: dict[str, Any]) -> Any:
    """The application builder a Ray Serve config names (`import_path: nerserve.compose:ray_application`,
    as in deploy/ray/rayservice.yaml): `args` are the server's settings (models, threads, …) plus
    `cpus_per_replica`; replica counts and autoscaling come from the config's deployment options."""
    from nerserve.service.config import Settings
    from nerserve.service.ray_app import application

    given = dict(args)
    cpus = float(given.pop("cpus_per_replica", 1.0))
    return application(Settings(**given), START_UP_EXPORTER, cpus)
