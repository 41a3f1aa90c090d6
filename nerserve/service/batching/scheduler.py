"""The per-model scheduler: a bounded queue of sentences, a collect+prepare stage and a run stage.

The queue (service.batching.fair_queue) is in fair order: across tenants by weight, across
requests within a tenant a sentence a round, and a request kept past the wait it was admitted for
goes first. A small request that arrives behind a large one waits for a few rounds, not for all
of it.

It is also the one estimator admission uses (`wait`): what a newcomer would wait under that
sharing, at the rates measured for back-to-back batches (service.batching.estimate).

Stage A waits for work, closes a batch (size, token budget, or max wait after its oldest item, or
as the device frees: service.batching.closing, by what the lanes are doing and the stages' times,
service.batching.timing),
drops items whose client went away or whose deadline passed, and prepares the batch (tokenise,
pad) in a thread. Stage B runs the graphs in lanes (service.batching.lanes), each a graph thread of
its own (two on a CPU, where two batches at once beat one batch on two cores, and on a device
behind HTTP workers, where the second launches the next pass while one runs, queued on the device
behind it; else one). A one-slot hand-off between them lets the next batch be prepared while the
current ones run. A lane takes the prepared batch from that slot itself, the moment its last pass
ends, and reports to the event loop after: the device's next pass never waits for the loop to work
through the answers of the last one. Nor for its prepare: a device left idle gets its next batch
before the last one's answers go out.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import time
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

from nerserve.service.batching.closing import ClosingRules
from nerserve.service.batching.estimate import AdmissionEstimate
from nerserve.service.batching.fair_queue import FairQueue
from nerserve.service.batching.lanes import GraphLanes, LanePass, lower_worker_priority
from nerserve.service.batching.packing import BatchLimits, select_batch
from nerserve.service.batching.timing import LaneTimes
from nerserve.service.batching.work import (
    Answer,
    BatchObserver,
    BatchRecord,
    BatchTimes,
    DeadlineExceeded,
    Draining,
    ItemResult,
    ModelBroken,
    NullObserver,
    PreparedBatch,
    QueueFull,
    Wait,
    WorkItem,
)

# _watch_lanes: a graph call running this many times its expected time (and pass_timeout at least)
# hangs; the factor leaves a slow model's large batches, whose times are extrapolated, their due
HUNG_PASS_FACTOR = 10.0
HUNG_CHECK_SECONDS = 1.0  # how often the lanes are looked at (more often for a short pass_timeout)


@dataclass
class Scheduler:
    """`prepare(payloads) -> prepared`, `run(prepared) -> outputs` (the graphs) and
    `finish(prepared, outputs) -> results` (one per payload, in order). Each stage has its own
    thread: the next batch is prepared while the graphs run, and a batch is decoded while the
    graphs run the next one, so the graph thread never waits for host work."""

    prepare: Callable[[list[Any]], Any]
    run: Callable[[Any], Any]
    finish: Callable[[Any, Any], list[Any]] = field(default=lambda prepared, outputs: list(outputs))
    limits: BatchLimits = field(default_factory=BatchLimits)
    observer: BatchObserver = field(default_factory=NullObserver)
    clock: Callable[[], float] = time.monotonic
    # Run in the graph thread when a batch ends with nothing else to run, at most every
    # `idle_every` seconds (service.memory.release_freed_memory: a burst's memory back).
    # Not more often: pages handed back are faulted in again by the next large batches, which
    # then drain a burst slower (docs/decisions/memory.md).
    on_idle: Callable[[], None] | None = None
    idle_every: float = 60.0
    # the positions the graphs computed for a prepared batch, padding included (the padding ratio
    # of /stats and the metrics); None: its items' costs, as if nothing were padded
    padded_tokens: Callable[[Any], int] | None = None
    # a tenant's weight in the fair order (the API key's share; 1 without keys)
    tenant_weight: Callable[[str], float] = field(default=lambda tenant: 1.0)
    # sentences of a request a round of the fair order (service.batching.fair_queue)
    fair_quantum: int = 1
    # A batch's answers one a turn of the event loop, where the HTTP front shares that loop: what
    # arrived meanwhile (a 401, a refusal, a new request) then waits for one answer to be written,
    # not for the batch's. An engine serving HTTP workers sends a turn's answers in one message.
    answer_per_turn: bool = True
    # Batches the graphs run at once, each in a graph thread of its own. On a CPU whose runtime
    # scales poorly across cores within one batch, two batches of one thread each finish sooner
    # than one batch on two (docs/decisions/graph-lanes.md); the prepared batch behind them waits
    # for the first lane to free.
    lanes: int = 1
    # run once in each graph thread as it starts (a CUDA stream of its own per lane)
    lane_setup: Callable[[], None] | None = None
    # Lanes that launch a device's passes and wait for them (CUDA, the simulated device) are one
    # device: its passes run one after another, so a lane's pass ends after those queued before
    # it, a queue is not shared among free lanes, and admission's cycle is the device's. Their
    # threads keep the event loop's OS priority: the device's next pass waits for its thread to
    # get the interpreter back, which at a lower priority on a busy core it did only once the loop
    # had answered the last batch. Graph threads that compute on the CPU run below the loop.
    lanes_drive_a_device: bool = False
    # The device's own clock for a pass (runtime.pass_clock: CUDA events, the simulated device's
    # account; a graph process's report of its pass), started in a lane's thread before its pass
    # and read there after. A lane's clock also counts its thread's waits for the interpreter lock,
    # which grow with the host work beside the pass; the halves of a closed loop are judged by what
    # they cost the device (`LaneTimes.device`).
    pass_clock: Callable[[], Callable[[], float]] | None = None
    # A pass on a sentence the model answered at start-up (the warm-up's), run after a batch fails.
    # If it fails too, the model's graphs no longer work (a graph process gone, a device in an error
    # state) and every request would fail, each after a pass a sentence: the model is broken instead
    # (`broken` says why), what it holds fails at once, and `on_broken` is told, once.
    probe: Callable[[], Any] | None = None
    on_broken: Callable[[str], None] | None = None
    broken: str | None = None
    # A graph call (a pass, a probe) still running after this many seconds, and HUNG_PASS_FACTOR
    # times its expected time, hangs: the device or the graph process stopped answering, and no
    # later pass will run. The model is then broken too, and the sentences of the calls running
    # are answered at once rather than left waiting for ever. None: not watched.
    pass_timeout: float | None = None
    _in_flight: int = 0
    _accepting: bool = True
    _taken_tokens: int = 0  # sub-words out of the queue and not yet answered (prepared, handed over, running)
    _preparing: asyncio.Future[Any] | None = None  # the prepare running in its thread, if one is

    def __post_init__(self) -> None:
        self._queue: FairQueue[WorkItem] = FairQueue(self.tenant_weight, self.fair_quantum)
        self._arrived = asyncio.Event()
        self._graph_lanes = GraphLanes(
            self.lanes,
            self.run,
            took=self._lane_took,
            ran=self._lane_ran,
            clock=self.clock,
            setup=self.lane_setup,
            drive_a_device=self.lanes_drive_a_device,
            pass_clock=self.pass_clock,
        )
        self._slot_freed = asyncio.Event()  # a lane took the batch in the hand-off slot (LaneTimes.handed)
        self._preparer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="prepare", initializer=lower_worker_priority)
        self._finisher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="decode", initializer=lower_worker_priority)
        self._finishing: set[asyncio.Task[None]] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self.estimate = AdmissionEstimate(self.limits, self.lanes, self.lanes_drive_a_device)  # admission, Retry-After
        self._open: dict[int, int] = {}  # request number → its sentences not yet answered
        self._batches = 0
        self._last_idle = 0.0
        self._requests = 0  # submit() calls so far: each one's items carry its number
        # close_as_device_frees and the halves of ClosingRules: what the lanes are doing, the
        # stages' times by batch size, and a wake-up as a lane frees
        self.times = LaneTimes(self.lanes, self.lanes_drive_a_device)
        self._lane_freed = asyncio.Event()
        self._isolating: dict[int, list[WorkItem]] = {}  # failed batches waiting for the probe, by id
        # when the batch gathering closes beyond its limits and max_wait, and how much it takes
        self.closing = ClosingRules(self._queue, self.times, self.limits, self.clock)

    @property
    def depth(self) -> int:
        return len(self._queue)

    @property
    def in_flight(self) -> int:
        return self._in_flight

    @property
    def open_requests(self) -> int:
        """Requests submitted and not yet answered in full."""
        return len(self._open)

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._collect_loop())]
        if self.pass_timeout:
            self._tasks.append(asyncio.create_task(self._watch_lanes(self.pass_timeout)))
        self._graph_lanes.start(asyncio.get_running_loop())

    def submit(
        self,
        payloads: list[tuple[Any, int]],
        deadline: float | None = None,
        tenant: str = "",
        pending: int | None = None,
    ) -> list[asyncio.Future[ItemResult]]:
        """Queue sentences (payload, sub-words) as one unit: all accepted, or QueueFull for all;
        a future for each (see `enqueue`)."""
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[ItemResult]] = [loop.create_future() for _ in payloads]
        self.enqueue(payloads, futures, deadline, tenant, pending)
        return futures

    def enqueue(
        self,
        payloads: list[tuple[Any, int]],
        answers: Sequence[Answer],
        deadline: float | None = None,
        tenant: str = "",
        pending: int | None = None,
    ) -> None:
        """Queue sentences (payload, sub-words) as one unit, each answered through ANSWERS (one a
        sentence): all accepted, or QueueFull for all. `pending`: for a request not weighed at the
        edge (sent with its run), the requests let through there and not yet queued; it is then
        weighed once, here, by the edge's rule too."""
        if self.broken is not None:
            raise ModelBroken(self.broken)
        if not self._accepting:
            raise Draining("server is draining")
        queue, sentences = self._queue, len(payloads)
        if len(queue) + sentences > self.limits.max_queue:
            raise QueueFull(len(queue), retry_after=self.estimate.retry_after(queue.tokens))
        now = self.clock()
        costs = [payloads[0][1]] if sentences == 1 else [cost for _, cost in payloads]
        own = sum(costs)
        bound, time_left = self.limits.max_queue_seconds, None if deadline is None else deadline - now
        # the age bound: promised its wait, at least the admission bound (an estimate is not exact);
        # nothing promised before a rate is measured
        if self._surely_within(own, pending or 0, bound if time_left is None else min(bound, time_left)):
            due = now + bound
        else:
            wait = self.wait(costs, pending or 0, tenant)
            self._admit(wait, time_left, at_edge=pending is not None)
            due = now + max(wait.total, bound) if self.estimate.measured else math.inf
        if not sentences:  # a request of empty texts queues nothing
            return
        self._requests += 1
        request, first = self._requests, queue.next_tag(tenant)
        self.estimate.accepted(own, sentences)
        if sentences == 1:  # most requests through HTTP workers
            queue.push([WorkItem(payloads[0][0], own, now, deadline, answers[0], first, request, due, tenant)])
        else:
            queue.push(
                [
                    WorkItem(payload, cost, now, deadline, answer, queue.tag(first, index), request, due, tenant)
                    for index, ((payload, cost), answer) in enumerate(zip(payloads, answers, strict=True))
                ]
            )
        self._open[request] = sentences
        self._in_flight += sentences
        self.closing.in_flight(self._in_flight)
        self._arrived.set()

    def _surely_within(self, own: int, pending: int, seconds: float) -> bool:
        """Whether a newcomer of OWN sub-words would be done within SECONDS even behind all the
        work there is, at the slowest rate measured: `wait` would then admit it and promise it no
        later than SECONDS, as it does nearly every request below overload, without weighing the
        fair order's share of the queue for each."""
        others = self._taken_tokens + self._queue.tokens + pending * self.estimate.typical_sentence
        return self.estimate.surely_within(others + own, seconds)

    def wait(self, costs: Sequence[int], pending: int = 0, tenant: str = "") -> Wait:
        """The estimate admission uses, for a newcomer of `costs` (sub-words per sentence). Under
        fair sharing its last sentence runs once the work ahead of it is done: what is out of the
        queue already, the queued sentences that fair order puts before its last one (a round of
        every request of its tenant per sentence of its own, and the other tenants' share of that
        time), the first sentence of each of `pending` requests (let through at the edge, not yet
        queued: they will join the current round) and its own. Nothing measured yet: no wait
        (nothing is refused)."""
        sentences, own = len(costs), sum(costs)
        pending_tokens = pending * self.estimate.typical_sentence
        others = self._taken_tokens + self._queue.ahead_of(tenant, sentences) + pending_tokens
        return self.estimate.wait(others, own)

    def edge_wait(self, pending: int, tenant: str = "") -> Wait:
        """`wait` for a request whose body is not read yet, as one sentence of the median size: the
        least it can wait, so the edge never refuses what the queue would take (a request of many
        sentences is weighed again, whole, at its queue: `enqueue`)."""
        return self.wait([self.estimate.typical_sentence], pending, tenant)

    def _admit(self, wait: Wait, time_left: float | None, at_edge: bool = False) -> None:
        """Refuse at the door what could not be answered in time: within the request's deadline
        (its whole wait, its own sentences included), and within max_queue_seconds (the work of
        others it would wait on: a request whose own sentences take longer than that would get
        a 429 that no retry could ever turn into a 200; it is taken, and served a sentence a
        round beside the others). A request to an empty queue is taken, unless it is weighed for
        the edge too (`at_edge`), whose rule refuses it behind others' work running or let through."""
        bound = self.limits.max_queue_seconds
        if self.depth == 0 and not (at_edge and wait.others > bound):
            return
        if wait.others > bound or (time_left is not None and wait.total > time_left):
            raise QueueFull(self.depth, retry_after=max(1.0, wait.others - bound))

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
        for task in self._finishing:
            task.cancel()
        await asyncio.gather(*self._finishing, return_exceptions=True)
        for item in [*self._queue.clear(), *self._graph_lanes.stop()]:
            if not item.future.done():
                item.future.set_exception(Draining("server stopped"))
        self._preparer.shutdown(wait=False, cancel_futures=True)
        self._finisher.shutdown(wait=False, cancel_futures=True)

    def _finish(self, items: list[WorkItem], taken: bool = True) -> None:
        """`items` answered or dropped; `taken`: they had left the queue (prepared, handed over, run)."""
        self._in_flight -= len(items)
        if taken:
            self._taken_tokens -= sum(item.cost for item in items)
        for item in items:
            left = self._open.get(item.request, 0) - 1
            if left > 0:
                self._open[item.request] = left
            else:
                self._open.pop(item.request, None)

    def _drop_stale(self) -> None:
        now = self.clock()

        def stale(item: WorkItem) -> bool:
            return item.future.done() or (item.deadline is not None and now > item.deadline)

        removed = self._queue.remove_if(stale)
        if not removed:
            return
        gone = [item for item in removed if item.future.done()]
        late = [item for item in removed if not item.future.done()]
        for item in late:
            item.future.set_exception(DeadlineExceeded("deadline passed before the request ran"))
        self._finish(gone + late, taken=False)
        if gone:
            self.observer.dropped("client_gone", len(gone))
        if late:
            self.observer.dropped("deadline", len(late))

    async def _wait_for_batch(self) -> tuple[list[WorkItem], str]:
        """The next batch out of the queue, and why it closed (BatchRecord.closed); none when the
        queue emptied meanwhile (its items dropped as stale)."""
        while True:
            self._drop_stale()
            if self._queue:
                break
            self._arrived.clear()
            await self._arrived.wait()
        await self._rejoin_halves()
        limits = self.limits
        close_at = self._queue.oldest_arrival() + limits.max_wait_ms / 1000
        waited_for_company = False
        while True:
            self._drop_stale()
            if not self._queue:
                return [], ""
            full = len(self._queue) >= limits.max_batch_size or self._queue.tokens >= limits.max_batch_tokens
            remaining = close_at - self.clock()
            # Double buffering: while a prepared batch already waits for the graphs, this one keeps
            # growing (it could not run sooner anyway). Otherwise it closes at max_wait, or at once
            # when full, and is prepared while the graphs still run the current batch, so the graph
            # thread never idles through a prepare. With `close_when_idle` and graphs free to take it
            # (LaneTimes.graphs_free) it closes at once: waiting for company would only delay a lone request,
            # and under load company gathers while the graphs run; but on a device whose pass costs
            # mostly its launches, it waits a little for the rest of a closed loop (company_until),
            # whose next pass would otherwise cost as much again for a few. Batches still being decoded do
            # not hold the device: a batch's answers, travelling back while the device idles, are
            # the company a waiting batch would wait for in vain.
            idle = limits.close_when_idle and self.times.graphs_free()
            company_until = self.closing.company_until(self._in_flight) if idle and not full else None
            if company_until is not None:  # the rest of a closed loop is on its way: worth a pass
                idle = self.clock() >= company_until
                if not idle:
                    remaining = min(remaining, company_until - self.clock())
                    waited_for_company = True
            back = not (full or idle) and limits.close_as_device_frees and self.closing.clients_back()
            if full or idle or back:
                closed = "full" if full else "company" if idle and waited_for_company else "idle" if idle else "clients_back"
                break
            if remaining <= 0 and not self.times.handed:
                gather = self.times.gathering_time(self._queue.tokens, self.clock()) if limits.close_as_device_frees else 0.0
                if gather <= 0:
                    closed = "waited"
                    break
                # the device is busy for a while yet: gather until then, woken early if it frees
                self._lane_freed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._lane_freed.wait(), timeout=gather)
                continue
            self._arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), timeout=remaining if remaining > 0 else None)
        lane_limits = self.closing.lane_limits(limits)
        limits = self.closing.pipelined_limits(lane_limits)
        if limits.max_batch_size < lane_limits.max_batch_size:
            closed = "halves"
        formed = self.estimate.formed(min(self._queue.tokens, limits.max_batch_tokens))
        answered_by = self.clock() + self.times.time_to_answer(self._taken_tokens, formed, self.estimate.parallel)
        window = self._queue.order(limits.max_batch_size * limits.lookahead, answered_by)
        batch = [window[i] for i in sorted(select_batch(window, limits))]
        self._queue.take(batch)
        taken = sum(item.cost for item in batch)
        self.closing.taken(taken, self._in_flight)
        self._taken_tokens += taken
        return batch, closed

    def _timed(self, work: Callable[..., Any], *arguments: Any) -> tuple[Any, float]:
        """WORK's result and its own seconds, taken where it runs, for `LaneTimes.inline`: a thread's hand-off
        and wake-up are not the work's (on busy cores they alone pass timing.INLINE_HOST_SECONDS, and quick
        work timed with them would never be found quick). When a batch can start is another matter:
        there the loop's wait, hand-off included, is what counts (`LaneTimes.prepare`)."""
        started = self.clock()
        result = work(*arguments)
        return result, self.clock() - started

    async def _rejoin_halves(self) -> None:
        """Halves of a closed loop that proved too dear (`ClosingRules.rejoin`): the half queued waits
        for the device to finish the other and for that half's clients to send again, so that they
        travel as one batch again."""
        rejoined = self.closing.rejoin()
        if rejoined is None:
            return
        while not self.times.device_idle():
            self._lane_freed.clear()
            await self._lane_freed.wait()
        until = self.clock() + self.limits.max_wait_ms / 1000
        while self._queue.tokens < rejoined and (left := until - self.clock()) > 0:
            self._arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), timeout=left)

    async def _collect_loop(self) -> None:
        while True:
            batch, closed = await self._wait_for_batch()
            if not batch:
                continue
            tokens, closed_at = sum(item.cost for item in batch), self.clock()
            try:
                payloads = [item.payload for item in batch]
                if self.times.inline(self.times.prepare_work, tokens):
                    prepared, seconds = self._timed(self.prepare, payloads)
                else:
                    loop = asyncio.get_running_loop()
                    self._preparing = loop.run_in_executor(self._preparer, self._timed, self.prepare, payloads)
                    try:
                        prepared, seconds = await self._preparing
                    finally:
                        self._preparing = None
            except Exception as error:  # a batch that cannot be prepared fails its own items only
                await self._isolate(batch, error)
                continue
            self.times.prepare_work.observe(tokens, seconds)
            self.times.prepare.observe(tokens, self.clock() - closed_at)
            while self.times.handed:  # the slot holds a batch no lane has taken yet: this one waits
                self._slot_freed.clear()
                await self._slot_freed.wait()
            self.times.handed += 1
            self._graph_lanes.hand(PreparedBatch(batch, prepared, tokens, closed, closed_at, self.clock()))

    async def _watch_lanes(self, timeout: float) -> None:
        """Until the model is broken, a look at the lanes every so often for a graph call that hangs
        (`pass_timeout`); then the sentences of the calls still running are answered."""
        while self.broken is None:
            await asyncio.sleep(min(HUNG_CHECK_SECONDS, timeout / 4))
            now = self.clock()
            for lane, (since, _) in self._graph_lanes.running().items():
                expected = max(0.0, self.times.ends.get(lane, since) - since)
                if now - since > max(timeout, HUNG_PASS_FACTOR * expected):
                    self._break(
                        f"a call to the graphs has run {now - since:.0f} s ({expected:.1f} s expected): "
                        "the device or the graph process hangs"
                    )
                    break
        broken = ModelBroken(str(self.broken))
        waiting = [items for _, items in self._graph_lanes.running().values()] + list(self._isolating.values())
        for items in waiting:
            for item in items:  # counted as answered once (if ever) their lane or probe returns
                if not item.future.done():
                    item.future.set_exception(broken)

    def _lane_took(self, lane: int, work: PreparedBatch, started: float) -> None:
        """LANE took the handed batch at STARTED: the slot is free (the collector may close the next
        batch), and the lane is expected to end at the run time measured for that size."""
        self.times.took(lane, work.tokens, len(work.items), started)
        self._slot_freed.set()
        self._arrived.set()

    def _lane_ran(self, outcome: LanePass) -> None:
        """A lane's pass ended: its lane is free, and the batch's decoding is handed to the decode
        thread (or its failure isolated, or, if nobody waited for it any more, it is dropped)."""
        lane, work, started, finished = outcome.lane, outcome.work, outcome.started, outcome.finished
        device_seconds = outcome.device_seconds
        self.times.freed(lane)
        self._lane_freed.set()
        if self.limits.close_when_idle:  # a batch gathering closes now that the device is free
            self._arrived.set()
        batch, tokens = work.items, work.tokens
        if not outcome.wanted:
            self._finish(batch)
            self.observer.dropped("client_gone", len(batch))
            return
        if outcome.error is not None:
            self._spawn(self._isolate(batch, outcome.error))
            return
        self._batches += 1
        taken, started = started, self.times.ran(tokens, started, finished, device_seconds)
        self.estimate.batch_ran(lane, batch, tokens, finished, finished - started)
        times = BatchTimes(work.closed_at, work.handed_at, taken, started, finished, device_seconds=device_seconds)
        self._spawn(self._decode(work, outcome.outputs, times, lane, self._batches))

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._finishing.add(task)
        task.add_done_callback(self._finishing.discard)

    async def _decode(self, work: PreparedBatch, outputs: Any, times: BatchTimes, lane: int, number: int) -> None:
        """Outputs → results in the decode thread (on the loop where that is quick), then the
        batch's answers and its record, once an idle device has its next batch (`_device_fed`)."""
        batch, tokens, prepared = work.items, work.tokens, work.prepared  # tokens: counted as it closed
        started, seconds = times.started, times.finished - times.started
        await self._device_fed()
        try:
            if self.times.inline(self.times.decode, tokens):
                results, decoding = self._timed(self.finish, prepared, outputs)
            else:
                loop = asyncio.get_running_loop()
                results, decoding = await loop.run_in_executor(self._finisher, self._timed, self.finish, prepared, outputs)
        except Exception as error:
            await self._isolate(batch, error)
            return
        self.times.decode.observe(tokens, decoding)
        for item, result in zip(batch, results, strict=True):
            if not item.future.done():
                item.future.set_result(ItemResult(result, started - item.enqueued, seconds, number))
                if self.answer_per_turn:
                    await asyncio.sleep(0)
        self._finish(batch)
        self.observer.batch_done(
            BatchRecord(
                len(batch),
                tokens,
                self.padded_tokens(prepared) if self.padded_tokens else tokens,
                [started - item.enqueued for item in batch],
                seconds,
                times.finished,
                work.closed,
                lane,
                replace(times, answered=self.clock()),
            )
        )
        await self._when_idle(self.clock())

    async def _device_fed(self) -> None:
        """On a device left idle, until its next batch, being prepared in its thread or handed over,
        is on it: a finished batch's decoding and answers wait for that. They share the interpreter
        with the prepare and the lane's thread, and would slow the prepare threefold (at a lower OS
        priority, and behind the loop's hold on the lock); the device then idled through it. Its
        answers bring its clients' next sentences, which could not run before the next pass ends
        anyway. A device with a pass on it needs nothing from the host now: nothing waits."""
        while self.lanes_drive_a_device and not self.times.ends:
            if self._preparing is not None:
                await asyncio.wait([self._preparing])
            elif self.times.handed:
                self._slot_freed.clear()
                await self._slot_freed.wait()
            else:
                return

    async def _when_idle(self, now: float) -> None:
        on_idle = self.on_idle
        if on_idle is None or self._queue or self.times.handed or now - self._last_idle < self.idle_every:
            return
        self._last_idle = now
        with contextlib.suppress(Exception):  # housekeeping: never a reason to fail a request
            await self._graph_lanes.call(on_idle)

    async def _isolate(self, batch: list[WorkItem], error: Exception) -> None:
        """A batch that failed: each of its sentences again on its own, so one bad item fails
        alone and the others of its batch are answered; unless the model is broken (`probe`)."""
        self._isolating[id(batch)] = batch
        try:
            still_works = await self._still_works()
        finally:
            del self._isolating[id(batch)]
        if not still_works:
            self._fail(batch, ModelBroken(str(self.broken)))
            return
        if len(batch) == 1:
            self._fail(batch, error)
            return
        for item in batch:
            if item.future.done():
                self._finish([item])
                continue
            try:
                results = await self._graph_lanes.call(functools.partial(self._run_one, item.payload))
            except Exception as alone:
                self._fail([item], alone)
                continue
            self._batches += 1
            item.future.set_result(ItemResult(results[0], 0.0, 0.0, self._batches))
            self._finish([item])

    def _run_one(self, payload: Any) -> list[Any]:
        prepared = self.prepare([payload])
        return self.finish(prepared, self.run(prepared))

    async def _still_works(self) -> bool:
        """After a failed pass: whether the model still answers its probe (without one: assumed)."""
        if self.broken is None and self.probe is not None:
            try:
                await self._graph_lanes.call(self.probe)
            except Exception as error:
                self._break(f"{type(error).__name__}: {error}")
        return self.broken is None

    def _break(self, reason: str) -> None:
        """The model can no longer serve: what is queued fails, and nothing new is taken."""
        if self.broken is not None:  # another lane's failed batch found it first
            return
        self.broken = reason
        self._fail(self._queue.clear(), ModelBroken(reason), taken=False)
        if self.on_broken is not None:
            self.on_broken(reason)

    def _fail(self, batch: list[WorkItem], error: Exception, taken: bool = True) -> None:
        for item in batch:
            if not item.future.done():
                item.future.set_exception(error)
        self._finish(batch, taken)
