"""Graphs missing at start-up, exported in processes forked from one export server.

What `nerserve export` does, with a shorter parity check. The export itself is handed in by the
composition root (the command line) as an `Exporter`: the service never imports export or training
code, and its own process never loads them either (the exporter's function imports them in the
child). A server stopping (SIGTERM) ends
the exports still running: the threads waiting on them would otherwise hold the process after the
server has stopped until each export ended, past an orchestrator's grace period.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import multiprocessing
import multiprocessing.connection
import os
import shutil
import signal
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from pathlib import Path

from nerserve.ner.graph_format import EXPORT_JSON
from nerserve.ner.model_store import Locations

log = logging.getLogger("nerserve")

# A first start checks parity on 32 dev sentences (the longest 8 together, 6 alone, 18 in batches)
# rather than export's 200: the full check of a generative model takes minutes on a few cores.
START_UP_PARITY_SENTENCES = 32
_export_processes = multiprocessing.get_context("forkserver")
# How long an export has, once asked to stop, to end before it is killed
STOP_GRACE_SECONDS = 5.0


class ModelLoadError(RuntimeError):
    pass


@dataclass(frozen=True)
class Exporter:
    """How a server exports the graphs missing at start-up. `run(model_folder, format, int8, locations,
    parity_sentences, background, report)` runs in a child process and tells `report` (a Connection)
    ("staging", folder) once its staging folder exists, then ("done", None or why it failed).
    `preload`: modules the export server imports once for every export (torch, transformers and
    peft, seconds of every export otherwise)."""

    run: Callable[..., None]
    preload: tuple[str, ...] = ()


def _interrupt(processes: Iterable[BaseProcess]) -> None:
    """SIGINT first, on which an export ends at once; killed if not ended within the grace. Not
    joined here: the thread that started each one reaps it and removes its staging folder."""
    running = [process for process in processes if process.pid is not None]
    if not running:  # waiting on no process would take the whole grace (the usual shutdown: no export running)
        return
    for process in running:
        with contextlib.suppress(ProcessLookupError):  # ended meanwhile
            os.kill(process.pid, signal.SIGINT)  # type: ignore[arg-type]  # pid checked above
    multiprocessing.connection.wait([process.sentinel for process in running], timeout=STOP_GRACE_SECONDS)
    for process in running:
        if process.is_alive():
            process.kill()


class StartUpExports:
    """The exports of one server's start-up, and `stop()` for its shutdown."""

    def __init__(self, locations: Locations, exporter: Exporter | None) -> None:
        self.locations, self.exporter = locations, exporter
        if exporter is not None:
            _export_processes.set_forkserver_preload(list(exporter.preload))
        self._running: set[BaseProcess] = set()
        self._lock = threading.Lock()
        self._stopped = False

    def run(self, name: str, runtime: str, background: bool, int8: bool = False) -> Path:
        """The graph set folder of NAME (its INT8 graphs with `int8`), exported now if missing
        (`background`: at a lower priority)."""
        folder = self.locations.graph_set_folder(name, runtime, int8)
        runtime_named = f"{runtime} (INT8)" if int8 else runtime
        if (folder / EXPORT_JSON).is_file():
            return folder
        exporter = self.exporter
        if exporter is None:
            raise ModelLoadError(
                f"{name}: no {runtime_named} graphs at {folder}, and this server exports none (nerserve export)"
            )
        if importlib.util.find_spec("torch") is None:  # the serving-only install (nerserve[cpu] / [gpu])
            raise ModelLoadError(
                f"{name}: no {runtime_named} graphs at {folder}, and exporting them needs torch: "
                "pip install 'nerserve[export]', or export where it is installed and point --graph-cache at those graphs"
            )
        if self._stopped:
            raise ModelLoadError(f"{name}: not exported: the server is shutting down")
        log.info("exporting %s to %s (missing at start-up)", name, runtime_named)
        reason, exit_code = self._export(exporter, name, runtime, int8, background)
        if self._stopped:
            raise ModelLoadError(f"{name}: export to {runtime_named} stopped: the server is shutting down")
        if reason is not None or not (folder / EXPORT_JSON).is_file():  # logged where the load fails (service.main)
            raise ModelLoadError(f"{name}: export to {runtime_named} failed (exit {exit_code}): {reason}")
        return folder

    def _export(
        self, exporter: Exporter, name: str, runtime: str, int8: bool, background: bool
    ) -> tuple[str | None, int | None]:
        """(what went wrong or None, the exit code) of one export process."""
        receiving, sending = _export_processes.Pipe(duplex=False)
        source = self.locations.model_dir(name)
        arguments = (source, runtime, int8, self.locations, START_UP_PARITY_SENTENCES, background, sending)
        process = _export_processes.Process(target=exporter.run, args=arguments, name=f"export {name}")
        process.start()  # the first one starts the export server: seconds, during which stop() may come
        with self._lock:
            self._running.add(process)
            stopped = self._stopped
        if stopped:
            _interrupt([process])
        sending.close()  # the child holds the only writing end: its exit ends the wait below
        staging: str | None = None
        reason: str | None = "the export process ended without a result"
        try:
            while True:
                kind, value = receiving.recv()
                if kind == "staging":
                    staging = value
                    continue
                reason = value
                break
        except EOFError:  # ended (or was stopped) before its result
            pass
        finally:
            process.join()
            with self._lock:
                self._running.discard(process)
        if staging is not None:  # a process stopped mid-export did not remove its own
            shutil.rmtree(staging, ignore_errors=True)
        return reason, process.exitcode

    def stop(self) -> None:
        """End the exports running now, and any started from now on."""
        with self._lock:
            self._stopped = True
            running = list(self._running)
        _interrupt(running)
