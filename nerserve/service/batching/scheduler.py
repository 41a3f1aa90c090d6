"""The per-model scheduler: a bounded queue of sentences, a collect+prepare stage and a run stage.

The queue (service.batching.fair_queue) is in fair order: across tenants by weight, across
requests within a tenant a sentence a round, and a request kept past the wait it was admitted for
goes first. A small request that arrives behind a large one waits for a few rounds, not for all
of it.

It is also the one estimator admission uses (`wait`): what a newcomer would wait under that
sharing, counted in sub-words (a window of 384 sub-words costs what 20 short sentences cost) at the
sub-words per second measured for back-to-back batches.

Stage A waits for work, closes a batch (size, token budget, or max wait after its oldest item),
drops items whose client went away or whose deadline passed, and prepares the batch (tokenise,
pad) in a thread. Stage B runs the graphs in lanes, each a graph thread of its own (two on a
CPU, where two batches at once beat one batch on two cores, and on a device behind HTTP workers,
where the second launches the next pass while one runs, queued on the device behind it; else one). A one-slot hand-off
between them lets the next batch be prepared while the current ones run. A lane takes the prepared
batch from that slot itself, the moment its last pass ends, and reports to the event loop after:
the device's next pass never waits for the loop to work through the answers of the last one. Nor
for its prepare: a device left idle gets its next batch before the last one's answers go out.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import functools
import math
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Coroutine, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

from nerserve.service.batching.fair_queue import FairQueue
from nerserve.service.batching.packing import BatchLimits, select_batch
from nerserve.service.batching.rates import BatchRates, PassTimes
from nerserve.service.batching.work import (
    Answer,
    BatchObserver,
    BatchRecord,
    BatchTimes,
    DeadlineExceeded,
    Draining,
    ItemResult,
    LaneCall,
    ModelBroken,
    NullObserver,
    PreparedBatch,
    QueueFull,
    Wait,
    WorkItem,
)

REQUEST_SIZE_WINDOW = 101
# Every TYPICAL_SAMPLE-th request's sentence size joins that window (the first always): a sample
# sizes a typical sentence as well, and the window's upkeep a request cost the engine about a
# microsecond of the few it spends on one.
TYPICAL_SAMPLE = 4
# close_as_device_frees: what a prepared batch needs beyond its prepare to start as the running one
# ends (the hand-off, the run loop's turn, the graph thread's wake-up)
HAND_OFF_SECONDS = 0.003
# _pipelined_limits: halves cost a device at most this times the whole batch. A pass costs a fixed
# part (launches, reading the weights) and a part by sub-words: at 1.5 the latter is at least the
# former, and halves pay that fixed part once more to overlap the host's work with the device's.
PIPELINE_COST_RATIO = 1.5
# _pipelined_limits: a batch at this share of the device's batch limits counts as full (a closed
# loop's last few clients may send a moment after the batch closes)
FULL_SHARE = 0.9
# _wait_for_batch: a batch this many times the batch split in halves says the closed loop that was
# split is gone (its own batches hold at most its clients, whose sentences' lengths vary a little),
# and `_rejoin_halves` no longer waits for an idle device to rejoin it
SPLIT_FORGOTTEN = 2.0
# _rejoin_halves: the share of the batch that was split which, queued again, is the two halves rejoined
# (a few of its clients may have left, or send a little later)
REJOINED_SHARE = 0.9
# _company_until: the batches over which the sentences in flight at once are the load's population
# (the largest of each batch's gathering); a load that shrinks is forgotten after as many batches
POPULATION_WINDOW = 16
# A batch's prepare or decode expected to take at most this long runs on the event loop itself. Each
# hand-off to its thread and back (a wake-up of the thread, then of the loop through its pipe, each
# waiting for the interpreter lock) costs a lone sentence more than its own host work; past this
# the work would hold the loop's next requests longer than the hand-off saves.
INLINE_HOST_SECONDS = 0.001
# _watch_lanes: a graph call running this many times its expected time (and pass_timeout at least)
# hangs; the factor leaves a slow model's large batches, whose times are extrapolated, their due
HUNG_PASS_FACTOR = 10.0
HUNG_CHECK_SECONDS = 1.0  # how often the lanes are looked at (more often for a short pass_timeout)


class SlidingMedian:
    """The median of the last `size` values, kept in order as they come and go: it changes with
    every request the engine accepts, and statistics.median would sort the whole window each time."""

    def __init__(self, size: int) -> None:
        self._window: deque[int] = deque(maxlen=size)
        self._ordered: list[int] = []

    def add(self, value: int) -> None:
        if len(self._window) == self._window.maxlen:
            del self._ordered[bisect.bisect_left(self._ordered, self._window[0])]
        self._window.append(value)
        bisect.insort(self._ordered, value)

    @property
    def median(self) -> float:
        """As statistics.median: the middle value, or the mean of the two middle ones; 0 when empty."""
        ordered, count = self._ordered, len(self._ordered)
        return (ordered[(count - 1) // 2] + ordered[count // 2]) / 2 if count else 0.0


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
    # they cost the device (device_times).
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
    _device_free_at: float = 0.0  # when a device's last pass ended (lanes_drive_a_device)
    _split_whole: float | None = None  # the sub-words of the batch last split in halves (_pipelined_limits)
    _split_half: float = 0.0  # and of its first half
    _on_device: int = 0  # the sentences of the batch a lane took last (on the device while a lane runs)
    _in_flight_peak: int = 0  # the most sentences in flight while the batch now gathering did
    _preparing: asyncio.Future[Any] | None = None  # the prepare running in its thread, if one is

    def __post_init__(self) -> None:
        self._queue: FairQueue[WorkItem] = FairQueue(self.tenant_weight, self.fair_quantum)
        self._arrived = asyncio.Event()
        # What the lanes take, in order: prepared batches (one at most waits: the hand-off slot,
        # counted by the loop in _handed until a lane reports it taken), other calls, and None to stop.
        self._lane_work: queue.SimpleQueue[PreparedBatch | LaneCall | None] = queue.SimpleQueue()
        self._handed = 0
        self._slot_freed = asyncio.Event()
        self._lane_threads: list[threading.Thread] = []
        self._preparer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="prepare", initializer=_lower_worker_priority)
        self._finisher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="decode", initializer=_lower_worker_priority)
        self._finishing: set[asyncio.Task[None]] = set()
        self._tasks: list[asyncio.Task[None]] = []
        # sub-words per second end to end by batch sub-words (see _cycle_rate): admission, Retry-After
        self.rates = BatchRates(self.limits.max_batch_tokens)
        self._last_finished = [0.0] * self.lanes  # by lane
        # sub-words a sentence of the last accepted requests (each request's mean): their median
        # sizes a sentence at the edge, before a body is read (a mean of all sentences would be
        # moved by one request of a thousand windows)
        self._sentence_sizes = SlidingMedian(REQUEST_SIZE_WINDOW)
        self._typical_sentence = 0  # their median, kept at submit: the edge reads it for every arrival
        self._open: dict[int, int] = {}  # request number → its sentences not yet answered
        self._batches = 0
        self._last_idle = 0.0
        self._requests = 0  # submit() calls so far: each one's items carry its number
        # close_as_device_frees and the halves of _pipelined_limits: the graphs' own run time and the
        # prepare stage's, by batch size, when each running lane's batch is expected to end, and a
        # wake-up as a lane frees
        self.run_times = PassTimes()
        # the device's own time for those passes where it has a clock (pass_clock), else run_times'
        self.device_times = PassTimes()
        self.prepare_times = PassTimes()  # as the loop waits for it, a thread's hand-off included
        # for _inline only: the work's own time, where it runs
        self.prepare_work_times = PassTimes()
        self.decode_times = PassTimes()
        self._lane_ends: dict[int, float] = {}
        self._lane_freed = asyncio.Event()
        # each lane's graph call, since when, and its batch's items (none for other calls): written
        # by the lanes' threads, read by _watch_lanes
        self._lane_busy: dict[int, tuple[float, list[WorkItem]]] = {}
        self._isolating: dict[int, list[WorkItem]] = {}  # failed batches waiting for the probe, by id
        self._populations: deque[int] = deque(maxlen=POPULATION_WINDOW)  # _in_flight_peak of the last batches

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
        loop = asyncio.get_running_loop()
        self._tasks = [asyncio.create_task(self._collect_loop())]
        if self.pass_timeout:
            self._tasks.append(asyncio.create_task(self._watch_lanes(self.pass_timeout)))
        self._lane_threads = [
            threading.Thread(target=self._lane_main, args=(lane, loop), name=f"graphs_{lane}", daemon=True)
            for lane in range(self.lanes)
        ]
        for thread in self._lane_threads:
            thread.start()

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
            rate = self.rates.at(self._formed(queue.tokens)) or 1.0
            raise QueueFull(len(queue), retry_after=max(1.0, queue.tokens / rate))
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
            due = now + max(wait.total, bound) if self.rates else math.inf
        if not sentences:  # a request of empty texts queues nothing
            return
        self._requests += 1
        request, first = self._requests, queue.next_tag(tenant)
        if (request - 1) % TYPICAL_SAMPLE == 0:
            self._sentence_sizes.add(round(own / sentences))
            self._typical_sentence = round(self._sentence_sizes.median)
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
        self._in_flight_peak = max(self._in_flight_peak, self._in_flight)
        self._arrived.set()

    def _surely_within(self, own: int, pending: int, seconds: float) -> bool:
        """Whether a newcomer of OWN sub-words would be done within SECONDS even behind all the
        work there is, at the slowest rate measured: `wait` would then admit it and promise it no
        later than SECONDS, as it does nearly every request below overload, without weighing the
        fair order's share of the queue for each."""
        others = self._taken_tokens + self._queue.tokens + pending * self._typical_sentence
        slowest = self.rates.slowest
        return slowest > 0 and others + own <= seconds * slowest

    def first_estimate(self, passes: Sequence[tuple[int, float]]) -> None:
        """Admission's estimate before any batch has run: PASSES of (sub-words, seconds) run on an
        idle service (the warm-up's lone sentence, and on a GPU its full batch), times the lanes.
        Without it the first estimate is the first batch's run time, and a burst's first batch runs
        alone on an idle device while the loop parses the rest of the burst: on one core a lone
        sentence took four times its warm-up pass, and the burst's second request was refused on
        that estimate; on a GPU a lone sentence's rate says little of a full batch's."""
        if self.rates:
            return
        for tokens, seconds in passes:
            if tokens > 0 and seconds > 0:
                self.rates.observe(tokens, self._parallel * tokens / seconds)

    def _formed(self, queued: float) -> float:
        """The sub-words of the batches QUEUED sub-words would form: a batch holds max_batch_size
        sentences of the typical size at most (and max_batch_tokens sub-words: BatchRates)."""
        typical = self._typical_sentence
        return min(queued, self.limits.max_batch_size * typical) if typical else queued

    @property
    def _parallel(self) -> int:
        """Batches that run at once: a CPU's lanes; one on a device, whose lanes take turns."""
        return 1 if self.lanes_drive_a_device else self.lanes

    def wait(self, costs: Sequence[int], pending: int = 0, tenant: str = "") -> Wait:
        """The estimate admission uses, for a newcomer of `costs` (sub-words per sentence). Under
        fair sharing its last sentence runs once the work ahead of it is done: what is out of the
        queue already, the queued sentences that fair order puts before its last one (a round of
        every request of its tenant per sentence of its own, and the other tenants' share of that
        time), the first sentence of each of `pending` requests (let through at the edge, not yet
        queued: they will join the current round) and its own. Nothing measured yet: no wait
        (nothing is refused)."""
        sentences, own = len(costs), sum(costs)
        pending_tokens = pending * self._typical_sentence
        others = self._taken_tokens + self._queue.ahead_of(tenant, sentences) + pending_tokens
        rate = self.rates.at(self._formed(others + own))
        if not rate:
            return Wait(0.0, 0.0)
        return Wait(others / rate, (others + own) / rate)

    def edge_wait(self, pending: int, tenant: str = "") -> Wait:
        """`wait` for a request whose body is not read yet, as one sentence of the median size: the
        least it can wait, so the edge never refuses what the queue would take (a request of many
        sentences is weighed again, whole, at its queue: `enqueue`)."""
        return self.wait([self._typical_sentence], pending, tenant)

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
        left = list(self._queue.clear())
        with contextlib.suppress(queue.Empty):
            while True:  # work no lane took
                work = self._lane_work.get_nowait()
                if isinstance(work, PreparedBatch):
                    left.extend(work.items)
                elif isinstance(work, LaneCall):
                    work.outcome.cancel()
        for item in left:
            if not item.future.done():
                item.future.set_exception(Draining("server stopped"))
        for _ in self._lane_threads:
            self._lane_work.put(None)
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
            # (_graphs_free) it closes at once: waiting for company would only delay a lone request,
            # and under load company gathers while the graphs run; but on a device whose pass costs
            # mostly its launches, it waits a little for the rest of a closed loop (_company_until),
            # whose next pass would otherwise cost as much again for a few. Batches still being decoded do
            # not hold the device: a batch's answers, travelling back while the device idles, are
            # the company a waiting batch would wait for in vain.
            idle = limits.close_when_idle and self._graphs_free()
            company_until = self._company_until() if idle and not full else None
            if company_until is not None:  # the rest of a closed loop is on its way: worth a pass
                idle = self.clock() >= company_until
                if not idle:
                    remaining = min(remaining, company_until - self.clock())
                    waited_for_company = True
            back = not (full or idle) and limits.close_as_device_frees and self._clients_back()
            if full or idle or back:
                closed = "full" if full else "company" if idle and waited_for_company else "idle" if idle else "clients_back"
                break
            if remaining <= 0 and not self._handed:
                gather = self._gathering_time() if limits.close_as_device_frees else 0.0
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
        lane_limits = self._lane_limits(limits)
        limits = self._pipelined_limits(lane_limits)
        if limits.max_batch_size < lane_limits.max_batch_size:
            closed = "halves"
        answered_by = self.clock() + self._time_to_answer(self._formed(min(self._queue.tokens, limits.max_batch_tokens)))
        window = self._queue.order(limits.max_batch_size * limits.lookahead, answered_by)
        batch = [window[i] for i in sorted(select_batch(window, limits))]
        self._queue.take(batch)
        self._populations.append(self._in_flight_peak)
        self._in_flight_peak = self._in_flight
        taken = sum(item.cost for item in batch)
        self._taken_tokens += taken
        if self._split_whole is not None and taken > SPLIT_FORGOTTEN * self._split_whole:
            self._split_whole = None  # far more than the closed loop that was split: the load is another
        return batch, closed

    def _timed(self, work: Callable[..., Any], *arguments: Any) -> tuple[Any, float]:
        """WORK's result and its own seconds, taken where it runs, for `_inline`: a thread's hand-off
        and wake-up are not the work's (on busy cores they alone pass INLINE_HOST_SECONDS, and quick
        work timed with them would never be found quick). When a batch can start is another matter:
        there the loop's wait, hand-off included, is what counts (`prepare_times`)."""
        started = self.clock()
        result = work(*arguments)
        return result, self.clock() - started

    @staticmethod
    def _inline(times: PassTimes, tokens: int) -> bool:
        """Whether a batch's prepare or decode is quick enough to run on the loop (INLINE_HOST_SECONDS),
        by the times measured for its size; never before its size, or a larger one, has been timed."""
        return times.has_run(tokens) and times.seconds(tokens) <= INLINE_HOST_SECONDS

    def _graphs_free(self) -> bool:
        """Nothing prepared for the graphs, and graphs that can take a batch now: a device with no
        pass on it (its lanes take turns on it), or a CPU lane free (each lane has cores of its own,
        so a request that finds one free runs at once beside the other lane's batch)."""
        if self.lanes_drive_a_device:
            return self._device_idle()
        return len(self._lane_ends) < self.lanes and not self._handed

    def _device_idle(self) -> bool:
        """No batch on the graphs and none prepared for them (the collector wakes as a lane frees)."""
        return not self._lane_ends and not self._handed

    def _gathering_time(self) -> float:
        """How long the next batch may still gather and be prepared by the time the device, or the
        first CPU lane, frees, at the run and prepare times measured for batches of those sizes; 0 when
        nothing runs or neither is measured yet."""
        if not self._lane_ends or not self.run_times or not self.prepare_times:
            return 0.0
        # a device takes the next batch once its last queued pass ends; CPU lanes, as the first frees
        frees = max(self._lane_ends.values()) if self.lanes_drive_a_device else min(self._lane_ends.values())
        return frees - self.clock() - self._time_to_start(self._queue.tokens)

    def _time_to_start(self, tokens: float) -> float:
        """From a batch of TOKENS closing to its pass starting: twice its measured prepare (a prepare
        shares the cores) and the hand-off."""
        return 2 * self.prepare_times.seconds(tokens) + HAND_OFF_SECONDS

    def _time_to_answer(self, tokens: float) -> float:
        """From now until a batch of TOKENS sub-words closed now has run, at the times measured: the
        sub-words taken before it (running, prepared) at the graphs' pace, then its own start and
        pass. A request whose promise falls before then goes first in this batch (`FairQueue.order`):
        put first only once its promise had passed, its answer came a batch or two after it."""
        if not self.run_times:
            return 0.0
        ahead = self.run_times.seconds(self._taken_tokens) / self._parallel if self._taken_tokens else 0.0
        return ahead + self._time_to_start(tokens) + self.run_times.seconds(tokens)

    def _lane_limits(self, limits: BatchLimits) -> BatchLimits:
        """With lanes free, what is queued is shared among them: two half batches on one core each
        finish sooner than one whole batch that leaves a lane idle."""
        free = self.lanes - len(self._lane_ends) - self._handed
        if free <= 1 or self.lanes_drive_a_device:  # a device's lanes queue their passes on it: _pipelined_limits
            return limits
        share = math.ceil(len(self._queue) / free)
        return replace(limits, max_batch_size=max(1, min(limits.max_batch_size, share)))

    def _pipelined_limits(self, limits: BatchLimits) -> BatchLimits:
        """On a device left idle with many sentences queued, half of them first where that keeps it
        busier. Clients that send their next request as soon as they are answered otherwise travel
        as one batch: the device runs it while the host waits, then waits while the host answers,
        takes back and prepares all of it. Two halves alternate instead, one on the device while
        the host turns the other around, where two half passes cost the device at most
        PIPELINE_COST_RATIO times the whole one, from the pass times measured, and only for a size
        that has run whole (else it runs whole, and is measured); and where the second half can be
        prepared while the first runs, or the batch is full. A full batch on an idle device is a
        closed loop's clients all back at once: halves pay there even with a host slower than a
        half pass, since the device then waits only for what the host takes beyond the other
        half's pass, not for the whole of its turn. A partial one says that requests arrive slower
        than the device serves them (a slow front): halves would only add passes and their host
        work. A half's size that has never run is tried
        once in halves, and so measured: a pass's time between two sizes far apart is not their
        straight line (a device's cost climbs little until its cores are full), and a load whose
        batches are all of one size never runs one of half that size. Where the halves prove too
        dear, `_rejoin_halves` makes them one batch again."""
        if not limits.close_as_device_frees or not self._device_idle() or not self.run_times or not self.prepare_times:
            return limits
        count = min(len(self._queue), limits.max_batch_size)
        if count < 2:
            return limits
        whole = min(self._queue.tokens, limits.max_batch_tokens)
        if not self.run_times.has_run(whole):
            return limits
        full = count >= FULL_SHARE * limits.max_batch_size or whole >= FULL_SHARE * limits.max_batch_tokens
        half = whole * math.ceil(count / 2) / count  # the first half as it will run, and be measured
        if self._halves_dearer(whole, half) or not (full or self._host_keeps_up(half)):
            return limits
        self._split_whole, self._split_half = whole, half
        return replace(limits, max_batch_size=math.ceil(count / 2))

    def _company_until(self) -> float | None:
        """Until when a batch for an idle device waits for the rest of a closed loop, or None where
        it closes at once. On a device whose pass costs mostly a fixed part (the launches of a
        small batch's kernels, which Python makes one by one), a loop's clients that come back a
        few at a time would otherwise each find the device idle and go as a batch of their own,
        each paying that part: the loop travels as a few small batches where one would cost the
        device little more than any of them. So, where fewer sentences are in flight now than the
        most in flight at once over the last batches (the load's population), and a pass with the
        missing clients' sentences too would cost less than a second pass of what is queued, the
        batch waits for them: for at most a pass of its own (what the clients still out would wait
        behind it) and `max_wait_ms`, from its first sentence's arrival. A lone client, or an open
        load at its steady level, is always all in flight: no wait."""
        if not self.lanes_drive_a_device or not self.run_times or not self._queue:
            return None
        population = max(self._populations, default=0)
        if self._in_flight >= population:  # all of it: a client left behind goes on as a batch of its own
            return None
        queued, count = self._queue.tokens, len(self._queue)
        missing = population - self._in_flight
        if self.run_times.seconds(queued * (count + missing) / count) >= 2 * self.run_times.seconds(queued):
            return None
        return self._queue.oldest_arrival() + min(self.limits.max_wait_ms / 1000, self.run_times.seconds(queued))

    def _clients_back(self) -> bool:
        """Whether, with a pass on the device that ends before a batch closed now could start after
        it (`_gathering_time`), the batch gathering holds as many sentences as that pass's batch
        (FULL_SHARE of them; sentences, as clients come back, not sub-words, which vary with what
        each sends): a closed loop's next batch, its clients back. The other half, where a batch
        was split in halves; or another HTTP worker's requests, whose answers went out in one
        message and whose clients sent again together (two workers' clients take turns on the
        device so, without any batch split). Waiting on for max_wait would gather nothing more and
        only delay its prepare past the pass, leaving the device idle for the difference; where the
        pass leaves time, the batch gathers on. Not while a prepared batch waits for the device:
        this one would wait behind it, and may as well grow, so under a load the device cannot keep
        up with, batches still grow to its limits."""
        on_device = self._on_device
        back = bool(self._lane_ends) and not self._handed and on_device > 0 and len(self._queue) >= FULL_SHARE * on_device
        return back and self._gathering_time() <= 0

    def _host_keeps_up(self, half: float) -> bool:
        """Whether a batch of HALF sub-words can be prepared and handed over within a pass of its size."""
        return self._time_to_start(half) <= self.run_times.seconds(half)

    def _halves_dearer(self, whole: float, half: float) -> bool:
        """Whether two passes of HALF sub-words, that size measured, cost the device more than
        PIPELINE_COST_RATIO times one pass of WHOLE, by the device's own clock where it has one
        (`device_times`): a half's lane, beside the host turning the other half around, waits
        longer for the interpreter lock than a whole pass's beside an idle host, and by the lanes'
        clocks halves that keep the device busier looked dearer than they are. HALF is the first
        half as split (the larger of an odd count's two): the size the split's first pass measures,
        so that a split tried to measure it never goes on untold for want of a size it does not run."""
        times = self.device_times
        return times.measured(half) and 2 * times.seconds(half) > PIPELINE_COST_RATIO * times.seconds(whole)

    async def _rejoin_halves(self) -> None:
        """A closed loop split in halves (`_pipelined_limits`) stays split: each half gathers while the
        other runs. Where the halves proved too dear, the half queued waits for the device to finish
        the other and for that half's clients to send again (until the two fill the batch that was
        split, or max_wait after the device frees), so that they travel as one batch again."""
        whole = self._split_whole
        if whole is None or not self._halves_dearer(whole, self._split_half):
            return
        self._split_whole = None
        while not self._device_idle():
            self._lane_freed.clear()
            await self._lane_freed.wait()
        until = self.clock() + self.limits.max_wait_ms / 1000
        while self._queue.tokens < REJOINED_SHARE * whole and (left := until - self.clock()) > 0:
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
                if self._inline(self.prepare_work_times, tokens):
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
            self.prepare_work_times.observe(tokens, seconds)
            self.prepare_times.observe(tokens, self.clock() - closed_at)
            while self._handed:  # the slot holds a batch no lane has taken yet: this one waits
                self._slot_freed.clear()
                await self._slot_freed.wait()
            self._handed += 1
            self._lane_work.put(PreparedBatch(batch, prepared, tokens, closed, closed_at, self.clock()))

    def _lane_main(self, lane: int, loop: asyncio.AbstractEventLoop) -> None:
        """A graph thread: each prepared batch as soon as it is handed over and the lane's last pass
        has ended (a lane first, then the batch: while every lane is busy the slot stays full, so the
        collector keeps growing the next batch instead of closing another). What the loop must know
        it is told after, in order."""
        self._start_lane()
        while True:
            work = self._lane_work.get()
            if work is None:
                return
            if isinstance(work, LaneCall):
                if work.outcome.set_running_or_notify_cancel():
                    try:
                        with self._busy(lane, []):
                            work.outcome.set_result(work.call())
                    except BaseException as raised:  # the caller, on the loop, decides
                        work.outcome.set_exception(raised)
                continue
            started = self.clock()
            loop.call_soon_threadsafe(self._lane_took, lane, work.tokens, len(work.items), started)
            outputs: Any = None
            error: Exception | None = None
            device_seconds: float | None = None
            wanted = work.wanted()
            if wanted:
                try:
                    with self._busy(lane, work.items):
                        stop = self.pass_clock() if self.pass_clock is not None else None
                        outputs = self.run(work.prepared)
                        device_seconds = stop() if stop is not None else None
                except Exception as failure:
                    error = failure
            finished = self.clock()
            loop.call_soon_threadsafe(self._lane_ran, lane, work, wanted, outputs, error, started, finished, device_seconds)

    @contextlib.contextmanager
    def _busy(self, lane: int, items: list[WorkItem]) -> Iterator[None]:
        """In a lane's thread: what it runs, for _watch_lanes."""
        self._lane_busy[lane] = (self.clock(), items)
        try:
            yield
        finally:
            del self._lane_busy[lane]

    async def _watch_lanes(self, timeout: float) -> None:
        """Until the model is broken, a look at the lanes every so often for a graph call that hangs
        (`pass_timeout`); then the sentences of the calls still running are answered."""
        while self.broken is None:
            await asyncio.sleep(min(HUNG_CHECK_SECONDS, timeout / 4))
            now = self.clock()
            for lane, (since, _) in dict(self._lane_busy).items():
                expected = max(0.0, self._lane_ends.get(lane, since) - since)
                if now - since > max(timeout, HUNG_PASS_FACTOR * expected):
                    self._break(
                        f"a call to the graphs has run {now - since:.0f} s ({expected:.1f} s expected): "
                        "the device or the graph process hangs"
                    )
                    break
        broken = ModelBroken(str(self.broken))
        waiting = [items for _, items in dict(self._lane_busy).values()] + list(self._isolating.values())
        for items in waiting:
            for item in items:  # counted as answered once (if ever) their lane or probe returns
                if not item.future.done():
                    item.future.set_exception(broken)

    def _lane_took(self, lane: int, tokens: int, sentences: int, started: float) -> None:
        """LANE took the handed batch of TOKENS sub-words and SENTENCES at STARTED: the slot is free
        (the collector may close the next batch), and the lane is expected to end at the run time
        measured for that size."""
        self._handed -= 1
        self._slot_freed.set()
        self._on_device = sentences
        if self.lanes_drive_a_device:  # queued on the device behind the passes launched before it
            started = max([started, *self._lane_ends.values()])
        self._lane_ends[lane] = started + self.run_times.seconds(tokens)
        self._arrived.set()

    def _lane_ran(
        self,
        lane: int,
        work: PreparedBatch,
        wanted: bool,
        outputs: Any,
        error: Exception | None,
        started: float,
        finished: float,
        device_seconds: float | None = None,
    ) -> None:
        """A lane's pass ended: its lane is free, and the batch's decoding is handed to the decode
        thread (or its failure isolated, or, if nobody waited for it any more, it is dropped).
        DEVICE_SECONDS: the pass's own time on the device's clock, where it has one."""
        self._lane_ends.pop(lane, None)
        self._lane_freed.set()
        if self.limits.close_when_idle:  # a batch gathering closes now that the device is free
            self._arrived.set()
        batch, tokens = work.items, work.tokens
        if not wanted:
            self._finish(batch)
            self.observer.dropped("client_gone", len(batch))
            return
        if error is not None:
            self._spawn(self._isolate(batch, error))
            return
        self._batches += 1
        taken = started
        if self.lanes_drive_a_device:
            # its own pass: from when the one queued before it ended; a pass on a stream of its own
            # may end before one launched earlier, and its own time is then none rather than less
            started = min(max(started, self._device_free_at), finished)
            self._device_free_at = max(self._device_free_at, finished)
        self.run_times.observe(tokens, finished - started)
        own = finished - started if device_seconds is None else min(finished - started, device_seconds)
        self.device_times.observe(tokens, own)
        rate = self._cycle_rate(lane, batch, finished, finished - started)
        if rate is not None:
            self.rates.observe(tokens, rate)
        times = BatchTimes(work.closed_at, work.handed_at, taken, started, finished, device_seconds=device_seconds)
        self._spawn(self._decode(work, outputs, times, lane, self._batches))

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._finishing.add(task)
        task.add_done_callback(self._finishing.discard)

    async def _on_a_lane(self, call: Callable[[], Any]) -> Any:
        """CALL run by a graph thread, after what the lanes hold already."""
        outcome: Future[Any] = Future()
        self._lane_work.put(LaneCall(call, outcome))
        return await asyncio.wrap_future(outcome)

    async def _decode(self, work: PreparedBatch, outputs: Any, times: BatchTimes, lane: int, number: int) -> None:
        """Outputs → results in the decode thread (on the loop where that is quick), then the
        batch's answers and its record, once an idle device has its next batch (`_device_fed`)."""
        batch, tokens, prepared = work.items, work.tokens, work.prepared  # tokens: counted as it closed
        started, seconds = times.started, times.finished - times.started
        await self._device_fed()
        try:
            if self._inline(self.decode_times, tokens):
                results, decoding = self._timed(self.finish, prepared, outputs)
            else:
                loop = asyncio.get_running_loop()
                results, decoding = await loop.run_in_executor(self._finisher, self._timed, self.finish, prepared, outputs)
        except Exception as error:
            await self._isolate(batch, error)
            return
        self.decode_times.observe(tokens, decoding)
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
        while self.lanes_drive_a_device and not self._lane_ends:
            if self._preparing is not None:
                await asyncio.wait([self._preparing])
            elif self._handed:
                self._slot_freed.clear()
                await self._slot_freed.wait()
            else:
                return

    async def _when_idle(self, now: float) -> None:
        on_idle = self.on_idle
        if on_idle is None or self._queue or self._handed or now - self._last_idle < self.idle_every:
            return
        self._last_idle = now
        with contextlib.suppress(Exception):  # housekeeping: never a reason to fail a request
            await self._on_a_lane(on_idle)

    def _cycle_rate(self, lane: int, batch: list[WorkItem], finished: float, run_seconds: float) -> float | None:
        """Sub-words per second over a batch's whole cycle in its lane, from the previous batch's end
        there to its own, when it was waiting as that one ended (back to back: the capacity), times
        the lanes (back to back in one, the others are busy too). The graphs' run time alone
        over-states the rate: preparing the next batch, the event loop and the decoding share the
        cores with it, so waits promised from run times alone come out too short. A batch after an
        idle spell says how busy the service was, not how fast it is (such samples refuse bursts it
        could serve): none is taken from it, except, where nothing is measured yet (no
        `first_estimate`), an estimate from its run time (docs/decisions/admission.md). A device's
        lanes take turns on one device: its cycle is from the last pass's end on any of them."""
        parallel = self._parallel
        slot = 0 if self.lanes_drive_a_device else lane
        previous, self._last_finished[slot] = self._last_finished[slot], finished
        tokens = sum(item.cost for item in batch)
        if min(item.enqueued for item in batch) <= previous:
            return parallel * tokens / max(finished - previous, 1e-6)
        return None if self.rates else parallel * tokens / max(run_seconds, 1e-6)

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
                results = await self._on_a_lane(functools.partial(self._run_one, item.payload))
            except Exception as alone:
                self._fail([item], alone)
                continue
            self._batches += 1
            item.future.set_result(ItemResult(results[0], 0.0, 0.0, self._batches))
            self._finish([item])

    def _start_lane(self) -> None:
        if not self.lanes_drive_a_device:
            _lower_worker_priority()
        if self.lane_setup is not None:
            self.lane_setup()

    def _run_one(self, payload: Any) -> list[Any]:
        prepared = self.prepare([payload])
        return self.finish(prepared, self.run(prepared))

    async def _still_works(self) -> bool:
        """After a failed pass: whether the model still answers its probe (without one: assumed)."""
        if self.broken is None and self.probe is not None:
            try:
                await self._on_a_lane(self.probe)
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


# The batch threads run at a lower OS priority than the event loop (nice +10, this thread only:
# Linux gives each thread its own nice value). When they share a core, the loop then runs as soon
# as a request arrives, so a refusal or a finished answer does not wait out the graphs' time slice;
# the graphs still get every cycle the loop does not use.
WORKER_NICENESS = 10


def _lower_worker_priority() -> None:
    with contextlib.suppress(OSError, AttributeError):  # not Linux, or not permitted: run as is
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), WORKER_NICENESS)
