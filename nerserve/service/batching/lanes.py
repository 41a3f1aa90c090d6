"""The graph lanes: threads that run prepared batches through the graphs, one pass at a time each.

The scheduler's event loop hands a prepared batch over (`hand`), and the first lane whose last pass
has ended takes it, runs it and reports back to the loop, in order: that it took it (`took`), then
how its pass went (`ran`). A lane never waits for the loop between passes, so a device's next pass
does not wait for the answers of the last. Other work for the graphs (a failed batch's sentences one
by one, idle housekeeping) goes through the same lanes (`call`), behind what they hold already.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from nerserve.service.batching.work import LaneCall, PreparedBatch, WorkItem

# The batch threads run at a lower OS priority than the event loop (nice +10, this thread only:
# Linux gives each thread its own nice value). When they share a core, the loop then runs as soon
# as a request arrives, so a refusal or a finished answer does not wait out the graphs' time slice;
# the graphs still get every cycle the loop does not use.
WORKER_NICENESS = 10


def lower_worker_priority() -> None:
    with contextlib.suppress(OSError, AttributeError):  # not Linux, or not permitted: run as is
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), WORKER_NICENESS)


@dataclass(frozen=True, slots=True)
class LanePass:
    """How a lane's pass went, for the event loop."""

    lane: int
    work: PreparedBatch
    wanted: bool  # False: nobody waited for any of its sentences any more, and it did not run
    outputs: Any
    error: Exception | None
    started: float  # on the lanes' clock, when the lane took the batch and when its pass ended
    finished: float
    device_seconds: float | None  # the pass's own time on the device's clock, where it has one


@dataclass
class GraphLanes:
    """`count` graph threads running `run(prepared) -> outputs`. `took(lane, work, started)` and
    `ran(LanePass)` are called on the event loop."""

    count: int
    run: Callable[[Any], Any]
    took: Callable[[int, PreparedBatch, float], None]
    ran: Callable[[LanePass], None]
    clock: Callable[[], float] = time.monotonic
    # run once in each graph thread as it starts (a CUDA stream of its own per lane)
    setup: Callable[[], None] | None = None
    # Lanes that drive a device keep the event loop's OS priority: the device's next pass waits for
    # its thread to get the interpreter back, which at a lower priority on a busy core it did only
    # once the loop had answered the last batch. Lanes that compute on the CPU run below the loop.
    drive_a_device: bool = False
    # the device's own clock for a pass (Scheduler.pass_clock), started before it and read after
    pass_clock: Callable[[], Callable[[], float]] | None = None

    def __post_init__(self) -> None:
        # What the lanes take, in order: prepared batches, other calls, and None to stop.
        self._work: queue.SimpleQueue[PreparedBatch | LaneCall | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        # each lane's graph call, since when, and its batch's items (none for other calls): written
        # by the lanes' threads, read by `running`
        self._busy: dict[int, tuple[float, list[WorkItem]]] = {}

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._threads = [
            threading.Thread(target=self._main, args=(lane, loop), name=f"graphs_{lane}", daemon=True)
            for lane in range(self.count)
        ]
        for thread in self._threads:
            thread.start()

    def hand(self, work: PreparedBatch) -> None:
        """A prepared batch, for the first lane free."""
        self._work.put(work)

    async def call(self, call: Callable[[], Any]) -> Any:
        """CALL run by a graph thread, after what the lanes hold already."""
        outcome: Future[Any] = Future()
        self._work.put(LaneCall(call, outcome))
        return await asyncio.wrap_future(outcome)

    def running(self) -> dict[int, tuple[float, list[WorkItem]]]:
        """Each busy lane's graph call: since when, and its batch's items (none for other calls)."""
        return dict(self._busy)

    def stop(self) -> list[WorkItem]:
        """The lanes end once their passes do; the items of the batches no lane took are returned
        (the calls no lane took are cancelled)."""
        left: list[WorkItem] = []
        with contextlib.suppress(queue.Empty):
            while True:
                work = self._work.get_nowait()
                if isinstance(work, PreparedBatch):
                    left.extend(work.items)
                elif isinstance(work, LaneCall):
                    work.outcome.cancel()
        for _ in self._threads:
            self._work.put(None)
        return left

    def _main(self, lane: int, loop: asyncio.AbstractEventLoop) -> None:
        """A graph thread: each prepared batch as soon as it is handed over and the lane's last pass
        has ended (a lane first, then the batch: while every lane is busy the hand-off stays full, so
        the scheduler keeps growing the next batch instead of closing another)."""
        if not self.drive_a_device:
            lower_worker_priority()
        if self.setup is not None:
            self.setup()
        while True:
            work = self._work.get()
            if work is None:
                return
            if isinstance(work, LaneCall):
                self._call(lane, work)
                continue
            started = self.clock()
            loop.call_soon_threadsafe(self.took, lane, work, started)
            outputs: Any = None
            error: Exception | None = None
            device_seconds: float | None = None
            wanted = work.wanted()
            if wanted:
                try:
                    with self._running(lane, work.items):
                        stop = self.pass_clock() if self.pass_clock is not None else None
                        outputs = self.run(work.prepared)
                        device_seconds = stop() if stop is not None else None
                except Exception as failure:
                    error = failure
            outcome = LanePass(lane, work, wanted, outputs, error, started, self.clock(), device_seconds)
            loop.call_soon_threadsafe(self.ran, outcome)

    def _call(self, lane: int, work: LaneCall) -> None:
        if not work.outcome.set_running_or_notify_cancel():
            return
        try:
            with self._running(lane, []):
                work.outcome.set_result(work.call())
        except BaseException as raised:  # the caller, on the loop, decides
            work.outcome.set_exception(raised)

    @contextlib.contextmanager
    def _running(self, lane: int, items: list[WorkItem]) -> Iterator[None]:
        self._busy[lane] = (self.clock(), items)
        try:
            yield
        finally:
            del self._busy[lane]
