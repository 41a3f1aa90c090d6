"""A model's graphs in a process of their own (`--graph-process`): the scheduler's graph thread hands
each prepared batch to it over a pipe and waits, without the interpreter lock, for what decoding reads.

Why: the eager runtime launches a few hundred GPU kernels a batch from Python. In the server's own
process every launch waits for the interpreter lock, which the event loop holds while it answers
hundreds of requests a second, so a batch takes several times its offline time (docs/gpu.md). In a
process of its own the launches have a lock to themselves. Batches and outputs cross the pipe
pickled: arrays of ids in, the arrays decoding reads out (values a runtime kept on its device never
leave the child). Tokenising, admission, decoding and the HTTP front stay in the server's process.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from nerserve.ner.graph import GraphError, execution_providers

# spawn, not fork: a forked child would inherit the parent's threads' locks and CUDA state
_CONTEXT = multiprocessing.get_context("spawn")
START_TIMEOUT_SECONDS = 600.0


def _serve(connection: Connection, load: Callable[[], Any]) -> None:
    """The child: load the program, say so, then run every batch that arrives until told to stop."""
    try:
        program = load()
    except Exception as error:
        connection.send(("error", f"{type(error).__name__}: {error}"))
        return
    connection.send(("ready", execution_providers(program.graphs)))
    while True:
        try:
            message = connection.recv()
        except EOFError:  # the server is gone
            return
        if message is None:
            return
        batch, options = message
        try:
            outputs = program.run(batch, options)
            connection.send(("ok", {name: value for name, value in outputs.items() if isinstance(value, np.ndarray)}))
        except Exception as error:
            connection.send(("error", f"{type(error).__name__}: {error}"))


class GraphProcess:
    """One child process running one model's graphs; `run` is the scheduler's graph step. One
    batch at a time (the scheduler's graph thread is one thread; the lock keeps it so)."""

    def __init__(self, name: str, load: Callable[[], Any]) -> None:
        self.name = name
        self._connection, child = _CONTEXT.Pipe()
        self._process = _CONTEXT.Process(target=_serve, args=(child, load), name=f"graphs-{name}", daemon=True)
        self._process.start()
        child.close()
        self._lock = threading.Lock()
        if not self._connection.poll(START_TIMEOUT_SECONDS):
            self.close()
            raise GraphError(f"{name}: the graph process did not load its model within {START_TIMEOUT_SECONDS:g} s")
        status, detail = self._receive()
        if status != "ready":
            self.close()
            raise GraphError(f"{name}: the graph process could not load the model ({detail})")
        self.execution_providers: dict[str, str] = detail  # what each graph runs on, there

    def _receive(self) -> tuple[str, Any]:
        try:
            status, detail = self._connection.recv()
        except EOFError:
            raise GraphError(f"{self.name}: the graph process ended (exit code {self._process.exitcode})") from None
        return status, detail

    def run(self, prepared: tuple[Any, list[Any]]) -> dict[str, np.ndarray]:
        with self._lock:
            try:
                self._connection.send(prepared)
            except (BrokenPipeError, OSError):
                raise GraphError(f"{self.name}: the graph process ended (exit code {self._process.exitcode})") from None
            status, detail = self._receive()
        if status != "ok":
            raise GraphError(f"{self.name}: {detail}")
        outputs: dict[str, np.ndarray] = detail
        return outputs

    def close(self, wait: float = 10.0) -> None:
        """Ask the child to stop and give it WAIT seconds to, then make sure it has (WAIT 0: killed
        at once, unasked: a child that hangs reads nothing, and writing to a pipe it no longer
        drains could block)."""
        if wait > 0:
            with contextlib.suppress(BrokenPipeError, OSError):
                self._connection.send(None)
            self._process.join(timeout=wait)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
        self._connection.close()
