"""The per-model scheduler: a bounded queue of sentences, a collect+prepare stage and a run stage.

The queue is in fair order across requests (start-time fair queueing with a sentence as the
unit): a request's i-th sentence is tagged with the round being served when it arrived plus i, and
the queue is served by tag, then by arrival. A request of 500 sentences therefore takes one
sentence a round beside the others instead of holding the graphs for its whole length, and a
small request that arrives behind it waits for a few rounds, not for all of it.

Stage A waits for work, closes a batch (size, token budget, or max wait after its oldest item),
drops items whose client went away or whose deadline passed, and prepares the batch (tokenise,
pad) in a thread. Stage B runs the graphs in its own worker thread. A one-slot hand-off between
them lets the next batch be prepared while the current one runs.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import os
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from nerserve.service.batching.packing import BatchLimits, select_batch
from nerserve.service.batching.rates import BatchRates

REQUEST_SIZE_WINDOW = 101


class QueueFull(RuntimeError):
    def __init__(self, depth: int, retry_after: float) -> None:
        super().__init__(f"queue full ({depth} sentences waiting)")
        self.depth = depth
        self.retry_after = retry_after


class DeadlineExceeded(RuntimeError):
    pass


class Draining(RuntimeError):
    pass


@dataclass(frozen=True)
class ItemResult:
    """What one queued sentence gets back: its result and where its time went."""

    value: Any
    queue_seconds: float  # from submission to the start of its batch
    run_seconds: float  # its batch's graph + decode time (shared with the batch's other items)
    batch_id: int  # sentences of one batch share it (a request counts each batch's time once)


@dataclass
class WorkItem:
    payload: Any
    cost: int
    enqueued: float
    deadline: float | None
    future: asyncio.Future[Any]
    tag: int = 0  # fair-queueing round (see the module's docstring)
    request: int = 0  # which submit() it came from (a batch takes at most max_request_share of one)
    started: float | None = None


@dataclass
class BatchRecord:
    sentences: int
    tokens: int
    padded_tokens: int
    queue_seconds: list[float]
    run_seconds: float
    finished: float


class BatchObserver(Protocol):
    def batch_done(self, record: BatchRecord) -> None: ...
    def dropped(self, reason: str, count: int) -> None: ...


class _NullObserver:
    def batch_done(self, record: BatchRecord) -> None:
        pass

    def dropped(self, reason: str, count: int) -> None:
        pass


@dataclass
class Scheduler:
    """`prepare(payloads) -> prepared` and `run(prepared) -> results` (one per payload, in order)."""

    prepare: Callable[[list[Any]], Any]
    run: Callable[[Any], list[Any]]
    limits: BatchLimits = field(default_factory=BatchLimits)
    observer: BatchObserver = field(default_factory=_NullObserver)
    clock: Callable[[], float] = time.monotonic
    # Run in the graph thread when a batch ends with nothing else to run, at most every
    # `idle_every` seconds (service.runtime.memory.release_freed_memory: a burst's memory back).
    # Not more often: pages handed back are faulted in again by the next large batches, and at
    # every 5 s a 10-minute soak at 70 % of capacity drained its bursts slower (309 refusals, 31
    # without trimming).
    on_idle: Callable[[], None] | None = None
    idle_every: float = 60.0
    # the positions the graphs computed for a prepared batch, padding included (the padding ratio
    # of /stats and the metrics); None: its items' costs, as if nothing were padded
    padded_tokens: Callable[[Any], int] | None = None
    _queue: list[WorkItem] = field(default_factory=list)
    _in_flight: int = 0
    _accepting: bool = True

    def __post_init__(self) -> None:
        self._arrived = asyncio.Event()
        self._handoff: asyncio.Queue[tuple[list[WorkItem], Any]] = asyncio.Queue(maxsize=1)
        self._runner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="graphs", initializer=_yield_to_the_door)
        self._preparer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="prepare", initializer=_yield_to_the_door)
        self._tasks: list[asyncio.Task[None]] = []
        # sentences per second end to end by batch size (see _cycle_rate): admission and Retry-After
        self.rates = BatchRates(self.limits.max_batch_size)
        self._last_finished = 0.0
        # sentences of the last accepted requests: their median sizes a request at the edge (a mean
        # is moved by one request of a thousand windows: after one, the edge took every request for
        # one of its size and refused all of them)
        self._request_sizes: deque[int] = deque(maxlen=REQUEST_SIZE_WINDOW)
        self._request_size = 0.0  # their median, kept at submit: the edge reads it for every arrival
        self._batches = 0
        self._last_idle = 0.0
        self._round = 0  # the fair-queueing tag of the last batch's oldest item
        self._requests = 0  # submit() calls so far: each one's items carry its number

    @property
    def depth(self) -> int:
        return len(self._queue)

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._collect_loop()), asyncio.create_task(self._run_loop())]

    def submit(self, payloads: list[tuple[Any, int]], deadline: float | None = None) -> list[asyncio.Future[ItemResult]]:
        """Queue sentences (payload, cost) as one unit: all accepted, or QueueFull for all."""
        if not self._accepting:
            raise Draining("server is draining")
        if self.depth + len(payloads) > self.limits.max_queue:
            rate = self.rates.at(self.depth + len(payloads)) or 1.0
            raise QueueFull(self.depth, retry_after=max(1.0, (self.depth + len(payloads)) / rate))
        now = self.clock()
        self._admit(len(payloads), None if deadline is None else deadline - now)
        size = len(payloads)
        if size:  # a request of empty texts queues nothing
            self._request_sizes.append(size)
            self._request_size = statistics.median(self._request_sizes)
        loop = asyncio.get_running_loop()
        futures = []
        self._requests += 1
        for index, (payload, cost) in enumerate(payloads):
            future: asyncio.Future[Any] = loop.create_future()
            item = WorkItem(payload, cost, now, deadline, future, tag=self._round + index, request=self._requests)
            bisect.insort_right(self._queue, item, key=_tag)  # after the items of its round already queued
            futures.append(future)
        self._in_flight += len(payloads)
        self._arrived.set()
        return futures

    def request_rate(self, requests: int) -> float:
        """Requests per second this model answers with `requests` in flight, at the rate measured
        for the batches they would form (0 until one is measured): what the HTTP edge, which sees
        requests before their sentences, compares its count with."""
        if not self._request_size:
            return 0.0
        return self.rates.at(round(requests * self._request_size)) / self._request_size

    def _work_until_done(self, sentences: int) -> int:
        """Sentences that run before a request of `sentences` has run: the batch running now, the
        queued items its last sentence's tag comes after in fair order, and its own sentences."""
        ahead = bisect.bisect_right(self._queue, self._round + sentences - 1, key=_tag)
        taken = self._in_flight - self.depth  # out of the queue already: being prepared, handed over, running
        return ahead + taken + sentences

    def _admit(self, sentences: int, time_left: float | None) -> None:
        """Refuse at the door what could not be answered in time: within the request's deadline
        (its whole wait, its own sentences included), and within max_queue_seconds (the work of
        others it would wait on: a request whose own sentences take longer than that would get
        a 429 that no retry could ever turn into a 200; it is taken, and served a sentence a
        round beside the others). A request alone in an empty queue is always taken."""
        if self.depth == 0:
            return
        work = self._work_until_done(sentences)
        rate = self.rates.at(work)
        wait, others = (work / rate, (work - sentences) / rate) if rate else (0.0, 0.0)
        if others > self.limits.max_queue_seconds or (time_left is not None and wait > time_left):
            raise QueueFull(self.depth, retry_after=max(1.0, wait - self.limits.max_queue_seconds))

    async def drain(self, timeout: float) -> bool:
        """Refuse new work, then wait until everything accepted has been answered."""
        self._accepting = False
        end = self.clock() + timeout
        while self._in_flight > 0 and self.clock() < end:
            await asyncio.sleep(0.02)
        return self._in_flight == 0

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for item in self._queue:
            if not item.future.done():
                item.future.set_exception(Draining("server stopped"))
        self._queue.clear()
        self._runner.shutdown(wait=False, cancel_futures=True)
        self._preparer.shutdown(wait=False, cancel_futures=True)

    def _finish(self, items: list[WorkItem]) -> None:
        self._in_flight -= len(items)

    def _drop_stale(self) -> None:
        now = self.clock()
        kept: list[WorkItem] = []
        gone: list[WorkItem] = []
        late: list[WorkItem] = []
        for item in self._queue:
            if item.future.done():
                gone.append(item)
            elif item.deadline is not None and now > item.deadline:
                item.future.set_exception(DeadlineExceeded("deadline passed before the request ran"))
                late.append(item)
            else:
                kept.append(item)
        if gone or late:
            self._queue = kept
            self._finish(gone + late)
            if gone:
                self.observer.dropped("client_gone", len(gone))
            if late:
                self.observer.dropped("deadline", len(late))

    async def _wait_for_batch(self) -> list[WorkItem]:
        while True:
            self._drop_stale()
            if self._queue:
                break
            self._arrived.clear()
            await self._arrived.wait()
        limits = self.limits
        close_at = self._queue[0].enqueued + limits.max_wait_ms / 1000
        while True:
            self._drop_stale()
            if not self._queue:
                return []
            queued_tokens = sum(item.cost for item in self._queue[: limits.max_batch_size])
            full = len(self._queue) >= limits.max_batch_size or queued_tokens >= limits.max_batch_tokens
            remaining = close_at - self.clock()
            # Double buffering: while a prepared batch already waits for the graphs, this one keeps
            # growing (it could not run sooner anyway). Otherwise it closes at max_wait, or at once
            # when full, and is prepared while the graphs still run the current batch, so the graph
            # thread never idles through a prepare (measured: busy 82 % at c=64 when every batch
            # waited for the graphs to be free before it was even closed).
            if full or (remaining <= 0 and self._handoff.empty()):
                break
            self._arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), timeout=remaining if remaining > 0 else None)
        chosen = set(select_batch(self._queue, limits))
        self._round = max(self._round, self._queue[0].tag)
        batch = [item for i, item in enumerate(self._queue) if i in chosen]
        self._queue = [item for i, item in enumerate(self._queue) if i not in chosen]
        return batch

    async def _collect_loop(self) -> None:
        while True:
            batch = await self._wait_for_batch()
            if not batch:
                continue
            try:
                payloads = [item.payload for item in batch]
                prepared = await asyncio.get_running_loop().run_in_executor(self._preparer, self.prepare, payloads)
            except Exception as error:  # a batch that cannot be prepared fails its own items only
                await self._isolate(batch, error)
                continue
            await self._handoff.put((batch, prepared))

    async def _run_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            handed = await self._handoff.get()
            self._arrived.set()  # the hand-off slot is free: wake the collector to close the next batch
            batch, prepared = handed
            live = [item for item in batch if not item.future.done()]
            if not live:
                self._finish(batch)
                self.observer.dropped("client_gone", len(batch))
                continue
            started = self.clock()
            for item in batch:
                item.started = started
            try:
                results = await loop.run_in_executor(self._runner, self.run, prepared)
            except Exception as error:
                await self._isolate(batch, error)
                continue
            finished = self.clock()
            seconds = finished - started
            self._batches += 1
            for item, result in zip(batch, results, strict=True):
                if not item.future.done():
                    item.future.set_result(ItemResult(result, started - item.enqueued, seconds, self._batches))
            self._finish(batch)
            tokens = [item.cost for item in batch]
            rate = self._cycle_rate(batch, finished, seconds)
            if rate is not None:
                self.rates.observe(len(batch), rate)
            self.observer.batch_done(
                BatchRecord(
                    len(batch),
                    sum(tokens),
                    self.padded_tokens(prepared) if self.padded_tokens else sum(tokens),
                    [started - item.enqueued for item in batch],
                    seconds,
                    finished,
                )
            )
            await self._when_idle(finished)

    async def _when_idle(self, now: float) -> None:
        if self.on_idle is None or self._queue or not self._handoff.empty() or now - self._last_idle < self.idle_every:
            return
        self._last_idle = now
        with contextlib.suppress(Exception):  # housekeeping: never a reason to fail a request
            await asyncio.get_running_loop().run_in_executor(self._runner, self.on_idle)

    def _cycle_rate(self, batch: list[WorkItem], finished: float, run_seconds: float) -> float | None:
        """Sentences per second over a batch's whole cycle, from the previous batch's end to its own,
        when it was waiting as that one ended (back to back: the capacity). The graphs' run time
        alone over-states the rate: preparing the next batch, the event loop and the decoding
        share the cores with it (measured at 3× load: 75 sentences/s by run time, 62 delivered,
        and the waits it promised were a third too short). A batch after an idle spell says how
        busy the service was, not how fast it is (at 70 % load such samples refused bursts it
        could serve): none is taken from it, except the first estimate from its run time."""
        previous, self._last_finished = self._last_finished, finished
        if min(item.enqueued for item in batch) <= previous:
            return len(batch) / max(finished - previous, 1e-6)
        return None if self.rates else len(batch) / max(run_seconds, 1e-6)

    async def _isolate(self, batch: list[WorkItem], error: Exception) -> None:
        """A batch that failed: each of its sentences again on its own, so one bad item fails
        alone and the others of its batch are answered."""
        if len(batch) == 1:
            self._fail(batch, error)
            return
        loop = asyncio.get_running_loop()
        for item in batch:
            if item.future.done():
                self._finish([item])
                continue
            try:
                results = await loop.run_in_executor(self._runner, self._run_one, item.payload)
            except Exception as alone:
                self._fail([item], alone)
                continue
            self._batches += 1
            item.future.set_result(ItemResult(results[0], 0.0, 0.0, self._batches))
            self._finish([item])

    def _run_one(self, payload: Any) -> list[Any]:
        return self.run(self.prepare([payload]))

    def _fail(self, batch: list[WorkItem], error: Exception) -> None:
        for item in batch:
            if not item.future.done():
                item.future.set_exception(error)
        self._finish(batch)


def _tag(item: WorkItem) -> int:
    return item.tag


# The batch threads run at a lower OS priority than the event loop (nice +10, this thread only:
# Linux gives each thread its own nice value). When they share a core, the loop then runs as soon
# as a request arrives, so a refusal or a finished answer does not wait out the graphs' time slice;
# the graphs still get every cycle the loop does not use.
WORKER_NICENESS = 10


def _yield_to_the_door() -> None:
    with contextlib.suppress(OSError, AttributeError):  # not Linux, or not permitted: run as is
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), WORKER_NICENESS)
