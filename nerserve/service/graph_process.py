"""A model's graphs in a process of their own (`--graph-process`), or dealt out over several
(`--graph-processes`): each of the scheduler's graph lanes hands its prepared batches to a child
over a pipe of its own and waits, without the interpreter lock, for what decoding reads.

Why: the eager runtime launches a few hundred GPU kernels a batch from Python, and torch's bindings
release the interpreter lock around each one. In the server's process, every time a launch wants
the lock back it may wait a switch interval for the event loop (answering hundreds of requests a
second), the next batch's prepare or the last one's decode, so a pass takes several times its
offline time (docs/decisions/gpu-engine.md). In the child the passes have the interpreter to
themselves: its only threads are one per lane, each launching its own passes (on a stream of its
own on CUDA), so that, as in the server's process, the next pass is queued on the device while one
runs. Batches and outputs cross the pipes pickled: arrays of ids in, the arrays decoding reads out
(values a runtime kept on its device never leave the child), with the pass's own time: on the
device's clock where the child has one (`runtime.pass_clock`), else on the child's lane's, which
counts neither the pipes nor the server's waits for its interpreter (`GraphProcess.pass_clock`).
Tokenising, admission, decoding and the HTTP front stay in the server's process.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import queue
import threading
import time
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from nerserve.ner.graph import GraphError, execution_providers
from nerserve.ner.runtime import OwnSeconds, PassClock
from nerserve.ner.runtime.simulated import Timeline, made_simulated_device, share_the_device
from nerserve.service.interpreter import DEFAULT_SWITCH_MS, hand_over_quickly

# spawn, not fork: a forked child would inherit the parent's threads' locks and CUDA state
_CONTEXT = multiprocessing.get_context("spawn")
START_TIMEOUT_SECONDS = 600.0
# how long the control pipe waits for the child's answer (it answers at once unless it hangs)
CONTROL_TIMEOUT_SECONDS = 10.0


def _messages(connection: Connection) -> Iterator[Any]:
    """What a pipe brings, until told to stop (None) or the server is gone."""
    while True:
        try:
            message = connection.recv()
        except EOFError:
            return
        if message is None:
            return
        yield message


def _serve_lane(connection: Connection, program: Any, lane_setup: Callable[[], None] | None, clock: PassClock | None) -> None:
    """One lane in the child: every batch its pipe brings, answered with what decoding reads and the
    pass's own time (CLOCK's, the device's, where there is one; else this thread's)."""
    if lane_setup is not None:
        lane_setup()
    for message in _messages(connection):
        try:
            batch, options = message
            started = time.perf_counter()
            stop = clock() if clock is not None else None
            outputs = program.run(batch, options)
            seconds = stop() if stop is not None else time.perf_counter() - started
            kept = {name: value for name, value in outputs.items() if isinstance(value, np.ndarray)}
            connection.send(("ok", (kept, seconds)))
        except Exception as error:
            connection.send(("error", f"{type(error).__name__}: {error}"))


def _serve_control(connection: Connection) -> None:
    """The child's control pipe: its simulated device's report (the stand-ins count their busy time
    here, where they wait), whatever the lanes are doing."""
    for _ in _messages(connection):
        device = made_simulated_device()
        connection.send(device.report() if device is not None else None)


def _serve(
    control: Connection,
    connections: list[Connection],
    load: Callable[[], Any],
    lane_setup: Callable[[], None] | None,
    switch_ms: float,
    clock_of: Callable[[], PassClock | None] | None,
    timeline: Timeline | None,
) -> None:
    """The child: load the program, say so on the control pipe, then a thread a lane and one for
    control. `clock_of`: the device's clock, asked for once the graphs are loaded (a simulated
    device is made by them, on TIMELINE where the model's other graph processes book theirs)."""
    hand_over_quickly(switch_ms)
    if timeline is not None:
        share_the_device(timeline)
    try:
        program = load()
        clock = clock_of() if clock_of is not None else None
    except Exception as error:
        control.send(("error", f"{type(error).__name__}: {error}"))
        return
    control.send(("ready", execution_providers(program.graphs)))
    threads = [
        threading.Thread(target=_serve_lane, args=(connection, program, lane_setup, clock), name=f"lane-{i}", daemon=True)
        for i, connection in enumerate(connections)
    ]
    threads.append(threading.Thread(target=_serve_control, args=(control,), name="control", daemon=True))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


class _Child:
    """One graph process: its control pipe and its lanes' pipes (this side of each)."""

    def __init__(self, name: str, target_args: tuple[Any, ...], lanes: int) -> None:
        self.name = name  # what its errors name: the model (and which of its graph processes)
        self.control, control = _CONTEXT.Pipe()
        pipes = [_CONTEXT.Pipe() for _ in range(lanes)]
        ends = [child for _, child in pipes]
        self.process = _CONTEXT.Process(target=_serve, args=(control, ends, *target_args), name=f"graphs-{name}", daemon=True)
        self.process.start()
        for child in (control, *ends):
            child.close()
        self.lanes = [parent for parent, _ in pipes]
        self.control_lock = threading.Lock()

    def ended(self) -> GraphError:
        return GraphError(f"{self.name}: the graph process ended (exit code {self.process.exitcode})")

    def receive(self, connection: Connection) -> Any:
        """The child's answer; a pipe it closed (EOF) or reset by dying is a GraphError saying so."""
        try:
            return connection.recv()
        except (EOFError, OSError):
            raise self.ended() from None

    def send(self, connection: Connection, message: Any) -> None:
        try:
            connection.send(message)
        except OSError:  # BrokenPipeError, ConnectionResetError: the child is gone
            raise self.ended() from None

    def ready(self, deadline: float) -> dict[str, str]:
        """What each graph runs on, once the child says it has loaded the model by DEADLINE (monotonic)."""
        if not self.control.poll(max(0.0, deadline - time.monotonic())):
            raise GraphError(f"{self.name}: the graph process did not load its model within {START_TIMEOUT_SECONDS:g} s")
        status, detail = self.receive(self.control)
        if status != "ready":
            raise GraphError(f"{self.name}: the graph process could not load the model ({detail})")
        providers: dict[str, str] = detail
        return providers

    def device_report(self) -> dict[str, Any] | None:
        with self.control_lock:
            self.send(self.control, "report")
            if not self.control.poll(CONTROL_TIMEOUT_SECONDS):
                raise GraphError(f"{self.name}: the graph process did not answer within {CONTROL_TIMEOUT_SECONDS:g} s")
            report: dict[str, Any] | None = self.receive(self.control)
        return report

    def ask_to_stop(self) -> None:
        for connection in (self.control, *self.lanes):
            with contextlib.suppress(BrokenPipeError, OSError):
                connection.send(None)

    def end(self, deadline: float) -> None:
        """Give the child until DEADLINE (monotonic) to have stopped, then kill it."""
        self.process.join(timeout=max(0.0, deadline - time.monotonic()))
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        for connection in (self.control, *self.lanes):
            connection.close()


class GraphProcess:
    """The child processes running one model's graphs; `run` is the scheduler's graph step. `lanes`
    batches at a time, each over a pipe of its own: a caller takes a free pipe for its batch (the
    scheduler's lanes are as many, so none waits for one; the free ones in turn, so that passes run
    one after another go to each child in turn, as the warm-up's do), and `lane_setup` runs in each of the
    children's lane threads as it starts (a CUDA stream of its own). The lanes are dealt out over
    `processes` children, each an interpreter of its own (on a GPU, a CUDA context of its own), so
    that the passes of an eager device, each bound by Python launching its kernels, are launched
    side by side rather than one interpreter lock's turn at a time; a simulated device is one card
    for all of them. `switch_ms`: the children's interpreter switch interval, as the server's.
    `clock_of` gives a child's device clock for a pass (`runtime.pass_clock`, called there once the
    graphs are loaded)."""

    def __init__(
        self,
        name: str,
        load: Callable[[], Any],
        lanes: int = 1,
        lane_setup: Callable[[], None] | None = None,
        switch_ms: float = DEFAULT_SWITCH_MS,
        clock_of: Callable[[], PassClock | None] | None = None,
        processes: int = 1,
    ) -> None:
        if not 1 <= processes <= max(1, lanes):
            raise ValueError(f"{name}: {processes} graph processes for {lanes} lanes (each runs one lane or more)")
        self.name = name
        self._own = OwnSeconds()  # each calling thread's passes' own seconds, as its child timed them
        timeline = Timeline() if processes > 1 else None
        shares = [len(range(i, max(1, lanes), processes)) for i in range(processes)]
        self._children = [
            _Child(
                name if processes == 1 else f"{name} (graph process {i})", (load, lane_setup, switch_ms, clock_of, timeline), n
            )
            for i, n in enumerate(shares)
        ]
        self._free: queue.SimpleQueue[tuple[_Child, Connection]] = queue.SimpleQueue()
        # a child that ended: the others' passes would answer for it, and the probe that decides
        # whether the model still works (Scheduler.probe) could land on one of them
        self._gone: GraphError | None = None
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        try:
            providers = [child.ready(deadline) for child in self._children]
        except GraphError:
            self.close()
            raise
        self.execution_providers: dict[str, str] = providers[0]  # what each graph runs on, there
        for lane in range(max(1, lanes)):  # lane by lane across the children, so that few in use are spread
            child = self._children[lane % processes]
            self._free.put((child, child.lanes[lane // processes]))

    @property
    def lanes(self) -> int:
        return sum(len(child.lanes) for child in self._children)

    @property
    def processes(self) -> int:
        return len(self._children)

    def run(self, prepared: tuple[Any, Any]) -> dict[str, np.ndarray]:
        if self._gone is not None:
            raise self._gone
        child, connection = self._free.get()
        try:
            child.send(connection, prepared)
            status, detail = child.receive(connection)
        except GraphError as ended:  # one child gone is the model's graphs gone: every pass fails
            self._gone = ended
            raise
        finally:
            self._free.put((child, connection))
        if status != "ok":
            raise GraphError(f"{self.name}: {detail}")
        outputs: dict[str, np.ndarray]
        outputs, seconds = detail
        self._own.add(seconds)
        return outputs

    def pass_clock(self) -> Callable[[], float]:
        """The scheduler's clock for a lane's pass through these processes (Scheduler.pass_clock): the
        own time the children reported for the passes the calling thread ran through them since."""
        return self._own.clock()

    def device_report(self) -> dict[str, Any] | None:
        """The simulated device's report (card, busy seconds, passes), or None where it has none: the
        children's one card, as any of them books it (from the first that answers)."""
        error: GraphError | None = None
        for child in self._children:
            try:
                return child.device_report()
            except GraphError as failed:
                error = error or failed
        assert error is not None
        raise error

    def close(self, wait: float = 10.0) -> None:
        """Ask the children to stop and give them WAIT seconds to, then make sure they have (WAIT 0:
        killed at once, unasked: a child that hangs reads nothing, and writing to a pipe it no
        longer drains could block)."""
        if wait > 0:
            for child in self._children:
                child.ask_to_stop()
        deadline = time.monotonic() + wait
        for child in self._children:
            child.end(deadline)
