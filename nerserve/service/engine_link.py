"""The link between HTTP worker processes and the engine process (`--http-workers N`): one Unix
socket in a folder only this user can open, length-prefixed pickled messages both ways.

A worker asks (`call`, answered by a `reply` with the same id) or tells (no answer): `admit` and
`release` for the edge admission of a large body, `run_planned` (a request the worker planned:
sub-word units in, an entity set per unit out; the worker assembles the answer; a small body's
admission travels with it), `cancel` (its client went away), `records` (the responses it answered
in one turn of its loop, for /metrics), `metrics`, `stats`, `device_report`. The engine pushes its
`state` (readiness, the models' states and facts) on connection and whenever it changes. The
messages of one turn of a loop travel as one frame. The engine owns every count: what a worker had
admitted is released when its connection closes."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import os
import pickle
import signal
import struct
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from itertools import count
from typing import Any, Generic, TypeVar

from nerserve.ner.text.subword import SubwordEncoder
from nerserve.service.admission import Refusal
from nerserve.service.api.errors import ApiError
from nerserve.service.api.extraction import (
    Extraction,
    ExtractionQuery,
    PlannedQuery,
    PlannedRun,
    UnitAnswers,
    answer,
    plan_query,
)
from nerserve.service.api.state import ServiceState
from nerserve.service.engine import EngineState, LocalEngine
from nerserve.service.metrics import ResponseRecord
from nerserve.service.pipeline import Planner

log = logging.getLogger("nerserve")
LENGTH = struct.Struct("!I")
T = TypeVar("T")
READ_BYTES = 1 << 16
# How often the engine looks for a change worth pushing (a model ready or failed, draining): the
# workers' view of readiness lags by at most this.
PUBLISH_SECONDS = 0.05
# How long a worker waits for the engine's first message on a new connection before it tries again
# (and checks that the engine still lives): the engine sends it as it accepts.
FIRST_STATE_SECONDS = 1.0
ErrorParts = tuple[str, str, str | None, dict[str, str]]  # an ApiError's code, message, field, headers
# A request body up to this size (one to a few dozen sentences) is admitted together with its run:
# no round trip to the engine before it is read. A larger one is admitted before it is read.
ADMIT_WITH_RUN_BYTES = 4096
# For this long after the engine refused one of its requests, a worker asks before it reads any
# body: under overload most requests are refused, and reading and planning each before refusing it
# took the cores the graphs needed (goodput at 3x capacity fell from 0.95-1.06 to 0.83-0.88).
ASK_FIRST_SECONDS = 2.0
# Set, in a request's own task, when its admission travels with its run (RemoteEngine.admit).
_admitted_with_run: ContextVar[bool] = ContextVar("admitted_with_run", default=False)


@dataclass(frozen=True)
class EngineAddress:
    """Where a worker finds its engine: the socket, and the engine's process id (a worker whose
    parent is no longer that process is an orphan and stops)."""

    path: str
    pid: int


def frame(messages: list[Any]) -> bytes:
    """Messages as one frame: one pickle of the list, its length first."""
    data = pickle.dumps(messages, protocol=pickle.HIGHEST_PROTOCOL)
    return LENGTH.pack(len(data)) + data


class FrameReader:
    """Messages as they arrive: those of every complete frame in what the socket has, per read (a
    busy link delivers many at once; reading each by its length prefix would cost two awaits)."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self.reader = reader
        self.buffer = bytearray()

    async def read(self) -> list[Any]:
        while True:
            messages = self.complete()
            if messages:
                return messages
            chunk = await self.reader.read(READ_BYTES)
            if not chunk:
                raise asyncio.IncompleteReadError(bytes(self.buffer), None)
            self.buffer += chunk

    def complete(self) -> list[Any]:
        """The messages of every complete frame buffered, taken out of the buffer."""
        messages, offset, end = [], 0, len(self.buffer)
        with memoryview(self.buffer) as view:
            while end - offset >= LENGTH.size:
                (size,) = LENGTH.unpack_from(view, offset)
                if end - offset - LENGTH.size < size:
                    break
                start = offset + LENGTH.size
                # a peer of this user only: the socket is in a 0700 folder
                messages.extend(pickle.loads(view[start : start + size]))
                offset = start + size
        del self.buffer[:offset]
        return messages


class PerTurn(Generic[T]):
    """Items gathered during one turn of the event loop and handed on together as it ends."""

    def __init__(self, hand_on: Callable[[list[T]], None]) -> None:
        self.hand_on = hand_on
        self.pending: list[T] = []

    def add(self, item: T) -> None:
        if not self.pending:
            asyncio.get_running_loop().call_soon(self._flush)
        self.pending.append(item)

    def _flush(self) -> None:
        items, self.pending = self.pending, []
        self.hand_on(items)


class FrameWriter:
    """Messages written once per turn of the event loop, as one frame: the many small messages a
    turn makes go out in one system call (a write per message cost the engine's loop a sixth of its
    time) and are read with one unpickling (pickling each on its own cost the reader a quarter more
    a message)."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self.send = PerTurn[Any](self._write).add

    def _write(self, messages: list[Any]) -> None:
        if self.writer.is_closing():
            return
        try:
            data = frame(messages)
        except Exception:  # one message that cannot be pickled must not take the turn's others with it
            data = b"".join(map(_frame_alone, messages))
        self.writer.write(data)

    @property
    def closed(self) -> bool:
        return self.writer.is_closing()


def _frame_alone(message: tuple[Any, ...]) -> bytes:
    """A message in a frame of its own; a reply that cannot be pickled is answered as an internal
    error instead, so that its caller is not left waiting."""
    try:
        return frame([message])
    except Exception:
        log.exception("engine link: cannot send %r", message[0])
        if message[0] != "reply":
            return b""
        return frame([("reply", message[1], False, ("internal", "engine error: its answer could not be sent", None, {}))])


def error_parts(error: ApiError) -> ErrorParts:
    return error.code, error.message, error.field, error.headers


@dataclass(eq=False)
class _Worker:
    """One worker's connection, as the engine sees it."""

    out: FrameWriter
    admitted: int = 0  # requests it let through the edge and has not released
    watching: dict[int, PlannedRun] = field(default_factory=dict)  # run_planned call id → its run, until answered

    def send(self, message: Any) -> None:
        self.out.send(message)


class EngineServer:
    """Serves a LocalEngine to the HTTP workers."""

    def __init__(self, engine: LocalEngine) -> None:
        self.engine = engine
        self.workers: set[_Worker] = set()
        self.tasks: set[asyncio.Task[Any]] = set()
        self.published: EngineState | None = None
        self.server: asyncio.AbstractServer | None = None
        self.publisher: asyncio.Task[None] | None = None

    async def start(self, path: str) -> None:
        self.server = await asyncio.start_unix_server(self._serve, path)
        self.publisher = asyncio.create_task(self._publish_changes())

    async def close(self) -> None:
        if self.publisher is not None:
            self.publisher.cancel()
        if self.server is not None:
            self.server.close()
        for worker in list(self.workers):
            worker.out.writer.close()

    def publish(self) -> None:
        """Every worker gets the engine's state now (draining, say), if it changed."""
        current = EngineState.of(self.engine.state)
        if current != self.published:
            self.published = current
            for worker in self.workers:
                worker.send(("state", current))

    async def _publish_changes(self) -> None:
        while True:
            self.publish()
            await asyncio.sleep(PUBLISH_SECONDS)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        worker = _Worker(FrameWriter(writer))
        self.workers.add(worker)
        worker.send(("state", EngineState.of(self.engine.state)))
        incoming = FrameReader(reader)
        try:
            while True:
                for message in await incoming.read():
                    self._dispatch(worker, *message)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.workers.discard(worker)
            for _ in range(worker.admitted):  # a worker gone: what it had admitted no longer waits
                self.engine.release()
            for run in list(worker.watching.values()):
                run.cancel()
            writer.close()

    def _dispatch(self, worker: _Worker, method: str, call_id: int | None, args: tuple[Any, ...]) -> None:
        engine = self.engine
        if method == "run_planned":  # nearly every message
            self._run_planned(worker, call_id or 0, args)
        elif method == "records":
            engine.record_all(args[0])
        elif method == "admit":
            refusal = engine.edge.decide(*args)
            worker.admitted += refusal is None
            worker.send(("reply", call_id, True, refusal))
        elif method == "release":
            engine.release()
            worker.admitted -= 1
        elif method == "cancel":
            run = worker.watching.get(args[0])
            if run is not None:
                run.cancel()
        elif method in ("metrics", "stats", "device_report"):
            task = asyncio.create_task(self._answer(worker, method, call_id, args))
            self.tasks.add(task)  # held until done: the loop keeps only weak references to tasks
            task.add_done_callback(self.tasks.discard)
        else:
            worker.send(("reply", call_id, False, ("internal", f"unknown engine call {method!r}", None, {})))

    def _run_planned(self, worker: _Worker, call_id: int, args: tuple[Any, ...]) -> None:
        """A worker's planned request into the engine; its reply is sent when it is answered (no task
        a request: see PlannedRun)."""

        def answered(outcome: UnitAnswers | BaseException) -> None:
            worker.watching.pop(call_id, None)
            worker.send(_reply(call_id, "run_planned", outcome))

        try:
            model, query, tenant, admitted = args
            run = self.engine.start_planned(model, query, tenant, answered, admitted)
        except Exception as error:
            worker.send(_reply(call_id, "run_planned", error))
            return
        if not run.settled:
            worker.watching[call_id] = run

    async def _answer(self, worker: _Worker, method: str, call_id: int | None, args: tuple[Any, ...]) -> None:
        try:
            if method == "metrics":
                value: Any = await self.engine.metrics_text()
            elif method == "stats":
                value = await self.engine.stats()
            else:
                value = await self.engine.device_report()
        except Exception as error:
            worker.send(_reply(call_id, method, error))
            return
        worker.send(_reply(call_id, method, value))


def _reply(call_id: int | None, method: str, outcome: Any) -> tuple[Any, ...]:
    """The reply message to a call: its value, an ApiError's parts, or any other error as an
    internal one (logged here, with its traceback)."""
    if isinstance(outcome, ApiError):
        return ("reply", call_id, False, error_parts(outcome))
    if isinstance(outcome, BaseException):
        log.error("engine call %s failed", method, exc_info=outcome)
        return ("reply", call_id, False, ("internal", f"engine error: {type(outcome).__name__}", None, {}))
    return ("reply", call_id, True, outcome)


class RemoteEngine:
    """The engine as an HTTP worker reaches it; it keeps the worker's ServiceState a mirror of the
    engine's. A worker that loses its engine cannot answer anything: it says so and stops."""

    def __init__(self, address: EngineAddress, state: ServiceState) -> None:
        self.path = address.path
        self.engine_pid = address.pid
        self.state = state
        self.ids = count(1)
        self.pending: dict[int, asyncio.Future[tuple[bool, Any]]] = {}
        self.out: FrameWriter | None = None
        self.reader_task: asyncio.Task[None] | None = None
        self.encoders: dict[str, asyncio.Future[SubwordEncoder]] = {}  # by PlanningRule.tokenizer
        self.refused_at = -math.inf  # when the engine last refused a request of this worker (loop time)
        # the responses it answers in one turn of its loop, told to the engine as one message: a
        # message a response took the engine's loop as long again as counting it
        self.records = PerTurn[ResponseRecord](lambda records: self._tell("records", records))

    async def connect(self, timeout: float = 60.0) -> None:
        """Connects to the engine that started this process and takes its first state, waiting for
        its socket to open; fails as soon as that engine is gone (this process is then an orphan)."""
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            if os.getppid() != self.engine_pid or asyncio.get_running_loop().time() > deadline:
                raise ConnectionError(f"no engine answers at {self.path}")
            writer = None
            try:
                reader, writer = await asyncio.open_unix_connection(self.path)
                incoming = FrameReader(reader)
                first_messages = await asyncio.wait_for(incoming.read(), FIRST_STATE_SECONDS)
                break
            except (FileNotFoundError, ConnectionError, asyncio.IncompleteReadError, TimeoutError):
                if writer is not None:
                    writer.close()
                await asyncio.sleep(0.05)
        self.out = FrameWriter(writer)
        for message in first_messages:  # the engine's state first
            self._handle(message)
        self.reader_task = asyncio.create_task(self._read(incoming))

    async def close(self) -> None:
        if self.reader_task is not None:
            self.reader_task.cancel()
        if self.out is not None:
            self.out.writer.close()

    async def _read(self, incoming: FrameReader) -> None:
        try:
            while True:
                for message in await incoming.read():
                    self._handle(message)
        except (asyncio.IncompleteReadError, ConnectionError):
            self._lost()

    def _handle(self, message: tuple[Any, ...]) -> None:
        kind, *rest = message
        if kind == "state":
            rest[0].apply(self.state)
            self._prepare_planners()
            return
        call_id, ok, value = rest
        reply = self.pending.pop(call_id, None)
        if reply is not None and not reply.done():  # None: its client went away meanwhile
            reply.set_result((ok, value))

    def _lost(self) -> None:
        message = "the engine process is gone"
        for reply in self.pending.values():
            if not reply.done():
                reply.set_result((False, ("engine_unavailable", message, None, {})))
        self.pending.clear()
        if self.state.fatal is None and not self.state.draining:
            self.state.fatal = message
            log.error("%s: this HTTP worker stops", message)
            os.kill(os.getpid(), signal.SIGTERM)

    def _send(self, method: str, args: tuple[Any, ...], call_id: int | None = None) -> None:
        if self.out is None or self.out.closed:
            raise ApiError("engine_unavailable", "the engine process is gone")
        self.out.send((method, call_id, args))

    def _ask(self, method: str, *args: Any) -> tuple[int, asyncio.Future[tuple[bool, Any]]]:
        call_id = next(self.ids)
        reply: asyncio.Future[tuple[bool, Any]] = asyncio.get_running_loop().create_future()
        self.pending[call_id] = reply
        self._send(method, args, call_id)
        return call_id, reply

    def _value(self, reply: asyncio.Future[tuple[bool, Any]]) -> Any:
        """The answer, or its error raised (a refusal noted: see admit)."""
        ok, value = reply.result()
        if not ok:
            if value[0] == "queue_full":
                self.refused_at = asyncio.get_running_loop().time()
            raise ApiError(*value)
        return value

    async def _call(self, method: str, *args: Any) -> Any:
        _, reply = self._ask(method, *args)
        await reply
        return self._value(reply)

    def _prepare_planners(self) -> None:
        """The tokenizer of each model the engine serves, read in a thread as soon as the model is
        known (tens of milliseconds the event loop would otherwise spend on the model's first
        request); models whose tokenizers are the same file share one encoder (and its cache of
        words), several megabytes each."""
        for view in self.state.views.values():
            rule = view.planning
            if rule.tokenizer not in self.encoders:
                self.encoders[rule.tokenizer] = asyncio.ensure_future(asyncio.to_thread(rule.subword_encoder))

    async def planner(self, model: str) -> Planner:
        rule = self.state.model(model).planning
        if rule.tokenizer not in self.encoders:
            self._prepare_planners()
        try:
            return rule.planner(await self.encoders[rule.tokenizer])
        except Exception as error:  # the next request tries again
            self.encoders.pop(rule.tokenizer, None)
            log.exception("model %s: this HTTP worker cannot read its tokenizer", model)
            raise ApiError(
                "model_failed", f"model {model!r}: this HTTP worker cannot read its tokenizer ({error})", "model"
            ) from None

    async def extract(self, model: str, query: ExtractionQuery, tenant: str, gone: asyncio.Future[Any]) -> Extraction:
        """Planned and assembled here; the engine runs the units."""
        planned = await plan_query(await self.planner(model), query, self.state.settings.max_request_sentences)
        admitted = not _admitted_with_run.get()
        call_id, reply = self._ask("run_planned", model, PlannedQuery.of(query, planned), tenant, admitted)
        # a callback rather than asyncio.wait on both: its waiter and callbacks cost a worker more
        # a request than the callback does
        abandon = functools.partial(self._abandon, call_id)
        gone.add_done_callback(abandon)
        try:
            await reply
        finally:
            gone.remove_done_callback(abandon)
        answers: UnitAnswers = self._value(reply)
        return answer(query, planned, answers)

    def _abandon(self, call_id: int, _gone: asyncio.Future[Any]) -> None:
        """The client went away before its answer: the engine is told to drop the run, and the
        request ends as client_gone."""
        reply = self.pending.pop(call_id, None)
        if reply is None or reply.done():
            return
        reply.set_result((False, ("client_gone", "the client closed the connection before the answer", None, {})))
        with contextlib.suppress(ApiError):  # the engine is gone: it runs nothing any more
            self._send("cancel", (call_id,))

    async def admit(self, model: str | None, tenant: str, body_bytes: int | None) -> Refusal | None:
        """A small body is let through here and admitted by the engine with its run (one round trip
        to the engine a request instead of two); a larger one (or one of undeclared size), or any
        while the engine has lately refused this worker's requests, is admitted by the engine before
        it is read, so that a flood is refused unread."""
        now = asyncio.get_running_loop().time()
        small = body_bytes is not None and body_bytes <= ADMIT_WITH_RUN_BYTES
        if small and now - self.refused_at > ASK_FIRST_SECONDS:
            _admitted_with_run.set(True)
            return None
        refusal: Refusal | None = await self._call("admit", model, tenant)
        if refusal is not None:
            self.refused_at = now
        return refusal

    def release(self) -> None:
        if not _admitted_with_run.get():  # else the engine counted it with its run, and released it
            self._tell("release")

    def record(self, model: str, status: int, tenant: str | None, seconds: float | None) -> None:
        self.records.add((model, status, tenant, seconds))

    def _tell(self, method: str, *args: Any) -> None:
        with contextlib.suppress(ApiError):  # the engine is gone: nothing left to count in
            self._send(method, args)

    async def metrics_text(self) -> bytes:
        text: bytes = await self._call("metrics")
        return text

    async def stats(self) -> dict[str, Any]:
        table: dict[str, Any] = await self._call("stats")
        return table

    async def device_report(self) -> dict[str, Any] | None:
        report: dict[str, Any] | None = await self._call("device_report")
        return report
