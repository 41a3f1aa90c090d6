"""Batcher: packing as a pure function; the scheduler with a fake graph runner (no model)."""

import asyncio
import itertools
import random
import statistics
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import numpy as np
import pytest

from nerserve.service.batching.estimate import SlidingMedian
from nerserve.service.batching.packing import BatchLimits, select_batch
from nerserve.service.batching.scheduler import Scheduler
from nerserve.service.batching.work import (
    BatchRecord,
    DeadlineExceeded,
    Draining,
    ModelBroken,
    NullObserver,
    QueueFull,
    WorkItem,
)


@dataclass
class Item:
    cost: int
    request: int = 0


def test_sliding_median_is_the_median_of_the_last_values() -> None:
    """What the edge sizes an unread request by: statistics.median over the window, kept in order
    rather than sorted at every arrival (repeated values leave and come back)."""
    values = random.Random(0).choices(range(1, 40), k=500)
    median = SlidingMedian(7)
    assert median.median == 0.0
    for seen, value in enumerate(values, start=1):
        median.add(value)
        assert median.median == statistics.median(values[max(0, seen - 7) : seen])


def test_oldest_go_first_whatever_their_lengths() -> None:
    """Packed rows make a batch cost the sum of its sentences, so lengths need not be grouped."""
    queue = [Item(10), Item(50), Item(11), Item(9), Item(48)]
    assert select_batch(queue, BatchLimits(max_batch_size=3, max_batch_tokens=10_000)) == [0, 1, 2]


def test_token_budget_bounds_the_batch() -> None:
    queue = [Item(100), Item(100), Item(100), Item(10)]
    chosen = select_batch(queue, BatchLimits(max_batch_size=8, max_batch_tokens=250))
    assert chosen == [0, 1, 3]  # a third 100-token sentence would make 300; the 10 still fits
    assert select_batch([Item(900)], BatchLimits(max_batch_tokens=250)) == [0]  # oversized runs alone


def test_one_request_takes_at_most_its_share_of_a_batch() -> None:
    """A large request's sentences fill at most max_request_tokens sub-words of a batch, so the
    batch it holds the graphs for stays short; other requests' sentences still join."""
    queue = [Item(10, request=1) for _ in range(10)] + [Item(10, request=2), Item(10, request=2)]
    chosen = select_batch(queue, BatchLimits(max_request_tokens=40))
    assert chosen == [0, 1, 2, 3, 10, 11]
    assert len(select_batch(queue, BatchLimits())) == 12  # no share: everything that fits
    from nerserve.service.config import CPU_MAX_REQUEST_TOKENS, Settings

    assert Settings(device="cpu").request_tokens_bound == CPU_MAX_REQUEST_TOKENS
    assert Settings(device="cuda").request_tokens_bound is None  # a GPU batch's cost is mostly fixed


def test_a_long_window_runs_only_in_a_batch_it_heads() -> None:
    """A window over the share does not join a newcomer's batch (that batch would then take the
    window's time); it heads the next one, alone or with short sentences."""
    newcomer, window, next_window = Item(15, request=2), Item(380, request=1), Item(380, request=1)
    limits = BatchLimits(max_request_tokens=256)
    assert select_batch([newcomer, window, next_window], limits) == [0]
    assert select_batch([window, next_window, Item(15, request=3)], limits) == [0, 2]


def test_lookahead_limits_the_search() -> None:
    queue = [Item(5, request=1)] * 3 + [Item(5, request=2)]
    chosen = select_batch(queue, BatchLimits(max_batch_size=2, max_request_tokens=5, lookahead=1))
    assert chosen == [0]  # request 2's item is outside the 2-item window
    assert select_batch(queue, BatchLimits(max_batch_size=2, max_request_tokens=5, lookahead=2)) == [0, 3]


def make_scheduler(limits: BatchLimits, batches: list[list[str]] | None = None) -> Scheduler:
    seen = batches if batches is not None else []

    def prepare(payloads: list[str]) -> list[str]:
        return payloads

    def run(prepared: list[str]) -> list[str]:
        seen.append(list(prepared))
        return [p.upper() for p in prepared]

    return Scheduler(prepare=prepare, run=run, limits=limits)


def test_results_map_back_and_batches_form() -> None:
    async def scenario() -> tuple[list[str], list[list[str]]]:
        batches: list[list[str]] = []
        scheduler = make_scheduler(BatchLimits(max_batch_size=4, max_wait_ms=20), batches)
        scheduler.start()
        futures = scheduler.submit([(w, 3) for w in ["a", "b", "c", "d", "e"]])
        results = [r.value for r in await asyncio.gather(*futures)]
        await scheduler.stop()
        return results, batches

    results, batches = asyncio.run(scenario())
    assert results == ["A", "B", "C", "D", "E"]
    assert sorted(len(b) for b in batches) == [1, 4]


def test_a_lone_request_on_an_idle_device_does_not_wait_for_company() -> None:
    async def scenario() -> float:
        scheduler = make_scheduler(BatchLimits(max_wait_ms=2_000, close_when_idle=True))
        scheduler.start()
        started = time.perf_counter()
        await asyncio.gather(*scheduler.submit([("alone", 3)]))
        waited = time.perf_counter() - started
        await scheduler.stop()
        return waited

    assert asyncio.run(scenario()) < 0.5


def test_on_a_cpu_a_request_that_finds_a_lane_free_runs_at_once_beside_the_other() -> None:
    """Two CPU lanes, one busy with a long batch: a lone request runs at once on the free lane,
    not max_wait later nor after the long batch (each lane has cores of its own)."""

    def run(prepared: list[str]) -> list[str]:
        time.sleep(1.0 if prepared == ["long"] else 0.01)
        return list(prepared)

    async def scenario() -> float:
        limits = BatchLimits(max_wait_ms=2_000, close_when_idle=True)
        scheduler = Scheduler(prepare=lambda p: p, run=run, limits=limits, lanes=2)
        scheduler.start()
        long = scheduler.submit([("long", 3)])
        await asyncio.sleep(0.1)
        started = time.perf_counter()
        await asyncio.gather(*scheduler.submit([("short", 3)]))
        waited = time.perf_counter() - started
        await asyncio.gather(*long)
        await scheduler.stop()
        return waited

    assert asyncio.run(scenario()) < 0.5


def test_a_request_runs_at_once_while_the_last_batch_is_still_decoded() -> None:
    """The device is idle once a batch leaves the graphs: a request that arrives while that batch is
    decoded (here for a second) runs at once, not max_wait later, nor after the decoding."""
    ran: list[float] = []

    def run(prepared: list[str]) -> list[str]:
        ran.append(time.perf_counter())
        return list(prepared)

    def finish(prepared: list[str], outputs: list[str]) -> list[str]:
        if prepared == ["first"]:
            time.sleep(1.0)
        return outputs

    async def scenario() -> float:
        limits = BatchLimits(max_wait_ms=2_000, close_when_idle=True, close_as_device_frees=True)
        scheduler = Scheduler(prepare=lambda p: p, run=run, finish=finish, limits=limits)
        scheduler.start()
        first = scheduler.submit([("first", 3)])
        while not ran:  # the first batch is on the graphs, then in its decoding
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        sent = time.perf_counter()
        await asyncio.gather(*scheduler.submit([("second", 3)]))
        await asyncio.gather(*first)
        await scheduler.stop()
        return ran[1] - sent

    assert asyncio.run(scenario()) < 0.5


@pytest.mark.parametrize("answer_per_turn", [True, False])
def test_a_batchs_answers_go_out_one_a_turn_of_the_loop_where_the_front_shares_it(answer_per_turn: bool) -> None:
    """Work that arrives while a batch's answers are handed out (here: a callback scheduled when the
    first answer is taken) runs after one answer, not after all of them; an engine serving HTTP
    workers hands them out in one turn (its answers then leave in one message)."""
    order: list[str] = []

    async def scenario() -> None:
        limits = BatchLimits(max_batch_size=8, max_wait_ms=50)
        scheduler = Scheduler(prepare=lambda p: p, run=lambda p: list(p), limits=limits, answer_per_turn=answer_per_turn)
        scheduler.start()
        futures = scheduler.submit([(str(i), 3) for i in range(8)])

        def answered(index: int) -> None:
            order.append(f"answer {index}")
            if index == 0:
                asyncio.get_running_loop().call_soon(order.append, "arrival")

        for index, future in enumerate(futures):
            future.add_done_callback(lambda _, index=index: answered(index))
        await asyncio.gather(*futures)
        await scheduler.stop()

    asyncio.run(scenario())
    assert order.index("arrival") == (1 if answer_per_turn else 8)


def test_a_batch_is_decoded_while_the_graphs_run_the_next() -> None:
    events: list[tuple[str, str, float]] = []

    def run(prepared: list[str]) -> list[str]:
        events.append(("run", threading.current_thread().name, time.perf_counter()))
        return prepared

    def finish(prepared: list[str], outputs: list[str]) -> list[str]:
        events.append(("decode", threading.current_thread().name, time.perf_counter()))
        time.sleep(0.3)
        events.append(("decoded", threading.current_thread().name, time.perf_counter()))
        return [o.upper() for o in outputs]

    async def scenario() -> list[str]:
        limits = BatchLimits(max_batch_size=1, max_wait_ms=0)
        scheduler = Scheduler(prepare=lambda p: p, run=run, finish=finish, limits=limits)
        scheduler.start()
        results = [r.value for r in await asyncio.gather(*scheduler.submit([("a", 3), ("b", 3)]))]
        await scheduler.stop()
        return results

    assert asyncio.run(scenario()) == ["A", "B"]
    runs = [e for e in events if e[0] == "run"]
    decodes = [e for e in events if e[0] == "decoded"]
    assert all(name.startswith("graphs") for _, name, _ in runs)
    assert all(name.startswith("decode") for _, name, _ in decodes)
    assert runs[1][2] < decodes[0][2]  # the second batch ran before the first was decoded


def test_queue_bound_refuses_whole_request() -> None:
    async def scenario() -> None:
        scheduler = make_scheduler(BatchLimits(max_queue=3))
        with pytest.raises(QueueFull) as full:
            scheduler.submit([("a", 1)] * 4)
        assert full.value.retry_after >= 1
        assert scheduler.depth == 0

    asyncio.run(scenario())


def test_deadline_and_cancelled_items_are_dropped_before_running() -> None:
    async def scenario() -> list[list[str]]:
        batches: list[list[str]] = []
        scheduler = make_scheduler(BatchLimits(max_wait_ms=30), batches)
        loop_time = scheduler.clock()
        late = scheduler.submit([("late", 1)], deadline=loop_time - 1)
        gone = scheduler.submit([("gone", 1)])
        kept = scheduler.submit([("kept", 1)])
        gone[0].cancel()
        scheduler.start()
        with pytest.raises(DeadlineExceeded):
            await late[0]
        assert (await kept[0]).value == "KEPT"
        await scheduler.stop()
        return batches

    assert asyncio.run(scenario()) == [["kept"]]


def test_drain_answers_accepted_work_then_refuses() -> None:
    async def scenario() -> None:
        scheduler = make_scheduler(BatchLimits(max_wait_ms=1))
        scheduler.start()
        accepted = scheduler.submit([("x", 1)] * 3)
        assert await scheduler.drain(timeout=5)
        assert [r.value for r in await asyncio.gather(*accepted)] == ["X"] * 3
        with pytest.raises(Draining):
            scheduler.submit([("y", 1)])
        await scheduler.stop()

    asyncio.run(scenario())


@pytest.mark.parametrize("host_ms, on_loop", [(0.0, True), (5.0, False)])
def test_quick_host_work_runs_on_the_loop_and_slow_host_work_in_its_threads(host_ms: float, on_loop: bool) -> None:
    """A batch's prepare and decode measured at INLINE_HOST_SECONDS or less run on the event loop
    (a hand-off to their threads and back costs a lone sentence more than the work); slower ones,
    and the first of each size (not yet measured), in their threads. The work is timed where it
    runs: a thread's hand-off, which on busy cores alone passes 1 ms, is not counted in."""
    threads: dict[str, list[str]] = {"prepare": [], "decode": []}

    def work(stage: str) -> None:
        threads[stage].append(threading.current_thread().name)
        if host_ms:  # sleep(0) would give up the core: on busy cores, quick work would wait its turn
            time.sleep(host_ms / 1000)

    def prepare(payloads: list[str]) -> list[str]:
        work("prepare")
        return payloads

    def finish(prepared: list[str], outputs: list[str]) -> list[str]:
        work("decode")
        return outputs

    async def scenario() -> None:
        scheduler = Scheduler(prepare=prepare, run=lambda prepared: prepared, finish=finish, limits=BatchLimits())
        scheduler.start()
        for _ in range(4):
            await asyncio.gather(*scheduler.submit([("a", 3)]))
        await scheduler.stop()

    asyncio.run(asyncio.wait_for(scenario(), timeout=10))
    for names in threads.values():
        assert names[0] != "MainThread"  # not yet measured
        assert all((name == "MainThread") == on_loop for name in names[1:]), names


def test_next_batch_is_prepared_while_the_graphs_run() -> None:
    """Double buffering: a batch closed while the graphs are busy is prepared before they finish."""
    events: list[str] = []
    release = threading.Event()

    def prepare(payloads: list[str]) -> list[str]:
        events.append("prepare " + ",".join(payloads))
        return payloads

    def run(prepared: list[str]) -> list[str]:
        events.append("run " + ",".join(prepared))
        if prepared == ["a"]:
            assert release.wait(timeout=5)
        events.append("done " + ",".join(prepared))
        return prepared

    async def scenario() -> None:
        scheduler = Scheduler(prepare=prepare, run=run, limits=BatchLimits(max_wait_ms=1))
        scheduler.start()
        first = scheduler.submit([("a", 1)])
        while "run a" not in events:
            await asyncio.sleep(0.001)
        second = scheduler.submit([("b", 1)])
        while "prepare b" not in events:
            await asyncio.sleep(0.001)
        release.set()
        await asyncio.gather(*first, *second)
        await scheduler.stop()

    asyncio.run(asyncio.wait_for(scenario(), timeout=10))
    assert events.index("prepare b") < events.index("done a")


def test_a_lane_takes_the_next_prepared_batch_itself_while_the_loop_is_busy() -> None:
    """As a pass ends, its graph thread starts the batch prepared behind it at once: the device does
    not wait for the event loop, busy here for 0.4 s (as with the answers of a large batch), to
    hand it over."""
    started: dict[str, float] = {}

    def run(prepared: list[str]) -> list[str]:
        started[",".join(prepared)] = time.monotonic()
        if prepared == ["a"]:
            time.sleep(0.2)
        return prepared

    async def scenario() -> tuple[float, float]:
        scheduler = Scheduler(prepare=lambda p: p, run=run, limits=BatchLimits(max_wait_ms=1))
        scheduler.start()
        first = scheduler.submit([("a", 1)])
        while "a" not in started:
            await asyncio.sleep(0.001)
        second = scheduler.submit([("b", 1)])
        await asyncio.sleep(0.05)  # b is prepared and handed over while a runs
        time.sleep(0.4)  # the loop busy past a's end
        loop_free = time.monotonic()
        await asyncio.gather(*first, *second)
        await scheduler.stop()
        return started["b"] - started["a"], loop_free - started["a"]

    b_after_a, loop_free_after_a = asyncio.run(asyncio.wait_for(scenario(), timeout=10))
    assert 0.2 <= b_after_a < loop_free_after_a - 0.1


@pytest.mark.parametrize("drives_a_device", [True, False])
def test_on_an_idle_device_a_batchs_answers_wait_until_the_next_batch_is_on_it(drives_a_device: bool) -> None:
    """Batch a runs (10 ms) while b, closed behind it, is prepared (60 ms, in its thread): the device
    is idle from a's end until b is on it, and a's answers, which share the interpreter with that
    prepare, go out after b's pass has started. On the CPU, where lanes compute on the cores
    themselves, nothing waits: a is answered as it ends, before b runs."""
    started: dict[str, float] = {}

    def prepare(payloads: list[str]) -> list[str]:
        time.sleep(0.06)  # past INLINE_HOST_SECONDS: in its thread
        return payloads

    def run(prepared: list[str]) -> list[str]:
        started[",".join(prepared)] = time.monotonic()
        time.sleep(0.01)
        return prepared

    async def scenario() -> float:
        limits = BatchLimits(max_wait_ms=1)
        scheduler = Scheduler(prepare=prepare, run=run, limits=limits, lanes_drive_a_device=drives_a_device)
        scheduler.start()
        first = scheduler.submit([("a", 1)])
        while "a" not in started:
            await asyncio.sleep(0.001)
        second = scheduler.submit([("b", 1)])
        await asyncio.gather(*first)
        answered = time.monotonic()
        await asyncio.gather(*second)
        await scheduler.stop()
        return answered - started["b"] if "b" in started else -1.0

    a_answered_after_b_started = asyncio.run(asyncio.wait_for(scenario(), timeout=10))
    assert (a_answered_after_b_started >= 0) == drives_a_device


@pytest.mark.parametrize("close_as_device_frees", [True, False])
def test_on_a_gpu_the_next_batch_gathers_until_the_running_one_is_about_to_end(close_as_device_frees: bool) -> None:
    """A GPU's batch costs little more for more sentences: while one runs (300 ms), the next keeps
    gathering past max_wait (b, then c 100 ms later, in one batch) until the running one is about
    to end, less its prepare time. Without the rule b closes at max_wait and c waits behind it."""
    events: list[str] = []

    def prepare(payloads: list[str]) -> list[str]:
        events.append("prepare " + ",".join(payloads))
        return payloads

    def run(prepared: list[str]) -> list[str]:
        events.append("run " + ",".join(prepared))
        time.sleep(0.3)
        events.append("done " + ",".join(prepared))
        return prepared

    async def scenario() -> None:
        limits = BatchLimits(max_wait_ms=5, close_when_idle=True, close_as_device_frees=close_as_device_frees)
        scheduler = Scheduler(prepare=prepare, run=run, limits=limits)
        scheduler.start()
        await asyncio.gather(*scheduler.submit([("w", 1)]))  # measures the run and prepare times
        first = scheduler.submit([("a", 1)])
        while "run a" not in events:
            await asyncio.sleep(0.001)
        second = scheduler.submit([("b", 1)])
        await asyncio.sleep(0.1)
        third = scheduler.submit([("c", 1)])
        await asyncio.gather(*first, *second, *third)
        await scheduler.stop()

    asyncio.run(asyncio.wait_for(scenario(), timeout=10))
    if close_as_device_frees:
        assert "run b,c" in events
    else:
        assert "run b" in events and "run c" in events


def test_admission_refuses_what_would_wait_too_long() -> None:
    """Once a rate is measured, a request that would wait on more than the bound of others' work
    gets QueueFull at once, with a Retry-After from that estimate; an empty queue always admits.
    What it waits on is what its last sentence has ahead of it in fair order: a round of every
    queued request per sentence of its own. Its own sentences count against a deadline only: a
    request longer than the bound by itself is taken (no retry could ever make it shorter)."""

    async def checked() -> None:
        scheduler = make_scheduler(BatchLimits(max_queue=10_000, max_queue_seconds=1.0))
        scheduler.estimate.rates.observe(1, 100.0)  # sub-words/s, as measured from the last batches
        scheduler.submit([("a", 1)] * 150)  # empty queue: admitted, though it is 1.5 s of work
        scheduler.submit([("b", 1)] * 45)  # waits on 45 of a's: 0.45 s ≤ 1 s
        with pytest.raises(QueueFull) as full:
            scheduler.submit([("c", 1)] * 60)  # waits on 60 of a's and 45 of b's: 1.05 s > 1 s
        assert full.value.retry_after >= 1 and scheduler.depth == 195
        scheduler.submit([("d", 1)] * 3)  # a small one is still taken: 3 + 3 sentences ahead
        with pytest.raises(QueueFull):  # 20 + 20 + 3 + its own 20: 0.63 s > its 0.5 s deadline
            scheduler.submit([("e", 1)] * 20, deadline=scheduler.clock() + 0.5)

    async def long_alone() -> int:
        scheduler = make_scheduler(BatchLimits(max_queue=10_000, max_queue_seconds=1.0))
        scheduler.estimate.rates.observe(1, 100.0)
        scheduler.submit([("x", 1)] * 2)
        scheduler.submit([("long", 1)] * 500)  # 5 s of its own, 0.02 s of others': taken
        return scheduler.depth

    asyncio.run(checked())
    assert asyncio.run(long_alone()) == 502


def test_the_wait_is_counted_in_sub_words() -> None:
    """Ten windows of 380 sub-words ahead are 3,800 sub-words of work, not ten sentences': at
    1,900 sub-words/s a request behind all of them would wait 2 s; behind one round of them (fair
    order), 0.2 s."""

    async def scenario() -> tuple[float, float]:
        scheduler = make_scheduler(BatchLimits(max_queue=10_000, max_queue_seconds=1.0))
        scheduler.estimate.rates.observe(512, 1900.0)
        scheduler.estimate.rates.observe(16, 1900.0)
        scheduler.submit([("window", 380)] * 10)
        one_sentence = scheduler.wait([20]).others
        scheduler.submit([("short", 20)])  # admitted: 0.2 s of others' work
        return one_sentence, scheduler.wait([20] * 10).others

    one_sentence, ten_sentences = asyncio.run(scenario())
    assert one_sentence == pytest.approx(380 / 1900)
    assert ten_sentences == pytest.approx((3800 + 20) / 1900)


@pytest.mark.parametrize("quantum", [1, 4])
def test_equal_requests_finish_a_batch_apart_with_a_quantum_of_their_size(quantum: int) -> None:
    """Two requests of four sentences, sent together, batches of four: with a sentence of each a
    round, each batch holds half of both, so both are answered only after the second; with four of
    each a round, the first batch holds all of the first request."""
    batches: list[list[str]] = []

    def run(prepared: list[str]) -> list[str]:
        batches.append(list(prepared))
        return prepared

    async def scenario() -> None:
        limits = BatchLimits(max_batch_size=4, max_wait_ms=0)
        scheduler = Scheduler(prepare=lambda p: p, run=run, limits=limits, fair_quantum=quantum)
        requests = [scheduler.submit([(f"{name}{i}", 3) for i in range(4)]) for name in "ab"]
        scheduler.start()
        await asyncio.gather(*requests[0], *requests[1])
        await scheduler.stop()

    asyncio.run(scenario())
    if quantum == 1:
        assert batches == [["a0", "b0", "a1", "b1"], ["a2", "b2", "a3", "b3"]]
    else:
        assert batches == [["a0", "a1", "a2", "a3"], ["b0", "b1", "b2", "b3"]]


def test_a_newcomer_waits_behind_a_quantum_of_each_request_of_its_round() -> None:
    """The estimate follows the order: with four sentences of a request a round, a one-sentence
    request behind a request of ten windows waits on four of them (one with a quantum of 1)."""

    def wait(quantum: int) -> float:
        async def scenario() -> float:
            scheduler = Scheduler(
                prepare=lambda p: p, run=lambda p: p, limits=BatchLimits(max_queue=10_000), fair_quantum=quantum
            )
            scheduler.estimate.rates.observe(512, 1900.0)
            scheduler.estimate.rates.observe(16, 1900.0)
            scheduler.submit([("window", 380)] * 10)
            return scheduler.wait([20]).others

        return asyncio.run(scenario())

    assert wait(1) == pytest.approx(380 / 1900)
    assert wait(4) == pytest.approx(4 * 380 / 1900)


@pytest.mark.parametrize(
    "starts_at, pass_seconds, first",
    [(1.5, None, True), (0.7, 0.4, True), (0.7, 0.05, False)],
    ids=["promise-passed", "answered-after-promise", "answered-before-promise"],
)
def test_an_overdue_request_goes_first_a_sentence_a_batch(starts_at: float, pass_seconds: float | None, first: bool) -> None:
    """No admitted request left behind: a request promised an answer by t = 1 s has two sentences
    queued behind newer requests in fair order. Once its promise has passed (t = 1.5 s), or would
    have passed by the time a batch closed now is answered (at 0.7 s, a batch taking 0.4 s), its
    next sentence goes before the newer requests' (one a batch, so they still wait a sentence of
    it, not all of it). Where a batch takes 0.05 s, at 0.7 s its sentences keep their fair place."""

    async def scenario() -> list[list[str]]:
        now = [0.0]
        batches: list[list[str]] = []
        scheduler = make_scheduler(BatchLimits(max_batch_size=2, max_wait_ms=0, max_queue=10_000), batches)
        scheduler.clock = lambda: now[0]
        scheduler.estimate.rates.observe(2, 100.0)
        if pass_seconds is not None:
            scheduler.times.run.observe(2, pass_seconds)
        scheduler.submit([("old", 1)])  # an empty queue: taken, due within the 1-s bound
        scheduler.submit([(f"L{i}", 1) for i in range(3)])  # promised an answer by t = 1 s
        now[0] = 0.7
        for index in range(4):  # newer requests ahead of L1, L2 in fair order, promised by 1.7 s
            scheduler.submit([(f"n{index}", 1)])
        now[0] = starts_at
        scheduler.start()
        await asyncio.sleep(0.2)
        await scheduler.stop()
        return batches

    order = [item for batch in asyncio.run(scenario()) for item in batch]
    ahead = order.index("L1") < order.index("n2") and order.index("L2") < order.index("n3")
    assert ahead == first, order


def test_a_large_request_does_not_hold_the_queue() -> None:
    """Fair order: a request queued behind a large one is served within a few rounds, and both
    keep their own sentences' order."""

    async def scenario() -> list[list[str]]:
        batches: list[list[str]] = []
        scheduler = make_scheduler(BatchLimits(max_batch_size=4, max_wait_ms=0), batches)
        large = scheduler.submit([(f"L{i}", 1) for i in range(20)])
        small = scheduler.submit([("s0", 1), ("s1", 1)])
        scheduler.start()
        await asyncio.gather(*large, *small)
        await scheduler.stop()
        return batches

    batches = asyncio.run(scenario())
    order = [item for batch in batches for item in batch]
    assert order.index("s1") < 6, batches  # not after the 20 of the large request
    assert [i for i in order if i.startswith("L")] == [f"L{i}" for i in range(20)]


@pytest.mark.parametrize("probed", [False, True])
def test_one_bad_item_fails_alone_not_its_batch(probed: bool) -> None:
    """With a probe that still passes, the model is not broken: the batch is isolated as without one."""
    told: list[str] = []

    async def scenario() -> list[object]:
        def run(prepared: list[str]) -> list[str]:
            if "bad" in prepared:
                raise ValueError("cannot run 'bad'")
            return [p.upper() for p in prepared]

        scheduler = Scheduler(
            prepare=lambda payloads: payloads,
            run=run,
            limits=BatchLimits(max_batch_size=8, max_wait_ms=50),
            probe=(lambda: run(["known"])) if probed else None,
            on_broken=told.append,
        )
        scheduler.start()
        futures = scheduler.submit([(w, 1) for w in ["a", "bad", "c"]])
        outcomes = await asyncio.gather(*futures, return_exceptions=True)
        await scheduler.stop()
        assert scheduler.in_flight == 0 and scheduler.broken is None
        return [o.value if not isinstance(o, Exception) else type(o).__name__ for o in outcomes]

    assert asyncio.run(scenario()) == ["A", "ValueError", "C"]
    assert told == []


def test_a_model_whose_probe_fails_too_is_broken_at_once_and_takes_nothing_new() -> None:
    """Graphs that stopped working fail every pass: the batch that found it and what is queued
    behind it fail at once, after a probe and no pass a sentence, and nothing new is queued."""
    passes: list[list[str]] = []
    told: list[str] = []
    first_pass_started = threading.Event()

    def run(prepared: list[str]) -> list[str]:
        passes.append(list(prepared))
        first_pass_started.set()
        time.sleep(0.05)  # the next request queues meanwhile
        raise OSError("the graph process ended")

    async def scenario() -> tuple[list[object], list[object]]:
        scheduler = Scheduler(
            prepare=lambda payloads: payloads,
            run=run,
            limits=BatchLimits(max_batch_size=8, max_wait_ms=1),
            probe=lambda: run(["known"]),
            on_broken=told.append,
        )
        scheduler.start()
        running = scheduler.submit([(w, 1) for w in ["a", "b", "c"]])
        await asyncio.to_thread(first_pass_started.wait)
        queued = scheduler.submit([("d", 1)])
        outcomes = await asyncio.gather(*running, *queued, return_exceptions=True)
        with pytest.raises(ModelBroken, match="OSError: the graph process ended"):
            scheduler.submit([("e", 1)])
        in_flight = scheduler.in_flight
        await scheduler.stop()
        assert in_flight == 0 and scheduler.depth == 0
        return outcomes[:3], outcomes[3:]

    running, queued = asyncio.run(scenario())
    assert all(isinstance(o, ModelBroken) for o in running + queued), running + queued
    # the batch, the probe (and the batch handed over behind it, if it was, with its own probe): no sentence alone
    assert passes[0] == ["a", "b", "c"] and ["known"] in passes and all(p in (["d"], ["known"]) for p in passes[1:])
    assert told == ["OSError: the graph process ended"]


def test_a_pass_that_hangs_breaks_the_model_and_its_sentences_are_answered_at_once() -> None:
    release = threading.Event()
    told: list[str] = []

    def run(prepared: list[str]) -> list[str]:
        release.wait(10)  # a device that stopped answering
        return [p.upper() for p in prepared]

    async def scenario() -> tuple[list[object], float, int]:
        scheduler = Scheduler(
            prepare=lambda payloads: payloads,
            run=run,
            limits=BatchLimits(max_batch_size=8, max_wait_ms=1),
            on_broken=told.append,
            pass_timeout=0.2,
        )
        scheduler.start()
        started = time.monotonic()
        outcomes = await asyncio.gather(*scheduler.submit([("a", 1), ("b", 1)]), return_exceptions=True)
        waited = time.monotonic() - started
        with pytest.raises(ModelBroken, match="hangs"):
            scheduler.submit([("c", 1)])
        release.set()  # the pass ends after all: its sentences are counted as answered, once
        for _ in range(200):
            if not scheduler.in_flight:
                break
            await asyncio.sleep(0.01)
        in_flight = scheduler.in_flight
        await scheduler.stop()
        return outcomes, waited, in_flight

    outcomes, waited, in_flight = asyncio.run(scenario())
    assert all(isinstance(o, ModelBroken) and "the device or the graph process hangs" in str(o) for o in outcomes)
    assert 0.2 <= waited < 5 and in_flight == 0
    assert len(told) == 1 and "hangs" in told[0]


def test_a_pass_slower_than_the_timeout_but_within_ten_times_its_usual_time_does_not_hang() -> None:
    durations = iter([0.05, 0.35])

    def run(prepared: list[str]) -> list[str]:
        time.sleep(next(durations))
        return [p.upper() for p in prepared]

    async def scenario() -> list[str]:
        scheduler = Scheduler(
            prepare=lambda payloads: payloads, run=run, limits=BatchLimits(max_batch_size=8, max_wait_ms=1), pass_timeout=0.2
        )
        scheduler.start()
        results = [r.value for r in await asyncio.gather(*scheduler.submit([("a", 1)]))]
        results += [r.value for r in await asyncio.gather(*scheduler.submit([("b", 1)]))]  # due in 0.5 s: 10 × 0.05
        await scheduler.stop()
        assert scheduler.broken is None
        return results

    assert asyncio.run(scenario()) == ["A", "B"]


EXTRACT_SCOPE = {"type": "http", "method": "POST", "path": "/extract", "headers": []}


async def _empty_body() -> dict[str, object]:
    return {"type": "http.request", "body": b"", "more_body": False}


def _recording(statuses: list[int]) -> Callable[[dict[str, object]], Awaitable[None]]:
    """An ASGI `send` that keeps the status of each response started."""

    async def send(message: dict[str, object]) -> None:
        if message["type"] == "http.response.start":
            statuses.append(int(message["status"]))  # type: ignore[call-overload]

    return send


def test_edge_admission_refuses_at_arrival_on_every_model_route() -> None:
    """Before the body is read, on /extract and the KServe v2 infer route alike: a wait over the
    bound → 429; none measured (None) or within it → the app. Other routes are not counted."""
    from nerserve.service.admission import EdgeAdmission, EdgeCounter

    async def scenario(path: str, waited: float | None, method: str = "POST") -> tuple[list[str], int, list[object]]:
        reached: list[str] = []
        asked: list[object] = []

        async def app(scope: dict[str, object], receive: object, send: object) -> None:
            reached.append("app")

        def wait(model: str | None, pending: int, tenant: str) -> float | None:
            asked.append((model, pending))
            return waited

        statuses: list[int] = []
        edge = EdgeAdmission(app, EdgeCounter(1.0, wait, lambda: 0))  # type: ignore[arg-type]
        scope = {**EXTRACT_SCOPE, "path": path, "method": method}
        await edge(scope, _empty_body, _recording(statuses))  # type: ignore[arg-type]
        return reached, statuses[0] if statuses else 0, asked

    assert asyncio.run(scenario("/extract", 0.5)) == (["app"], 0, [(None, 0)])
    assert asyncio.run(scenario("/extract", 1.5))[:2] == ([], 429)
    assert asyncio.run(scenario("/v2/models/span-conll03/infer", 1.5)) == ([], 429, [("span-conll03", 0)])
    assert asyncio.run(scenario("/v2/models/m/versions/1/infer", 1.5))[:2] == ([], 429)
    assert asyncio.run(scenario("/v2/models/span-conll03/infer", None))[:2] == (["app"], 0)
    assert asyncio.run(scenario("/models", 9.0, method="GET")) == (["app"], 0, [])


def test_edge_counts_requests_let_through_and_not_yet_queued() -> None:
    """Requests the edge let through that no scheduler holds yet (being read, parsed, planned)
    count as a sentence each of queued work: a burst is refused at the edge before it is parsed."""
    from nerserve.service.admission import EdgeAdmission, EdgeCounter

    seen: list[int] = []

    async def slow_app(scope: object, receive: object, send: object) -> None:
        await asyncio.sleep(0.01)

    def wait(model: str | None, pending: int, tenant: str) -> float:
        seen.append(pending)
        return pending * 0.3

    async def scenario() -> list[int]:
        statuses: list[int] = []
        edge = EdgeAdmission(slow_app, EdgeCounter(1.0, wait, lambda: 1))  # type: ignore[arg-type]  # one request queued
        calls = [edge(dict(EXTRACT_SCOPE), _empty_body, _recording(statuses)) for _ in range(6)]  # type: ignore[arg-type]
        await asyncio.gather(*calls)
        return statuses

    statuses = asyncio.run(scenario())
    assert seen == [0, 0, 1, 2, 3, 4] and statuses == [429]  # the sixth: 4 × 0.3 s > 1 s


def test_the_edge_sizes_a_request_as_one_median_sentence() -> None:
    """The edge weighs a request it has not read as one sentence of the median size: after one
    request of a thousand long windows among short ones, it does not take every newcomer for a
    thousand windows (nor count that request's backlog as their wait)."""

    async def scenario() -> tuple[float, float]:
        scheduler = Scheduler(prepare=lambda p: p, run=lambda p: list(p), limits=BatchLimits(max_queue=10_000))
        scheduler.estimate.rates.observe(512, 2000.0)
        scheduler.estimate.rates.observe(16, 2000.0)
        scheduler.submit([("short", 20)])
        scheduler.submit([("window", 380)] * 1000)
        scheduler.submit([("short", 20)])
        return scheduler.edge_wait(0).others, scheduler.edge_wait(10).others

    alone, with_pending = asyncio.run(scenario())
    assert alone == pytest.approx((20 + 380 + 20) / 2000)  # this round: a window and two sentences
    assert with_pending == pytest.approx((20 + 380 + 20 + 10 * 20) / 2000)


def test_a_request_sent_with_its_run_is_weighed_once_with_the_requests_let_through_ahead() -> None:
    """A request the edge has not weighed (`pending` given: a small body sent with its run) is
    weighed once, whole, at the queue: the requests let through and not yet queued count ahead of
    it, and by the edge's rule an empty queue takes it only if the work running and let through
    is within the bound. Without `pending` (weighed at the edge already) the empty queue takes it."""

    async def scenario() -> list[str]:
        limits = BatchLimits(max_queue=10_000, max_queue_seconds=1.0)
        scheduler = Scheduler(prepare=lambda p: p, run=lambda p: list(p), limits=limits)
        scheduler.estimate.rates.observe(16, 1000.0)  # sub-words a second
        for _ in range(30):  # 30 requests of one 20 sub-word sentence: 0.6 s of one round
            scheduler.submit([("queued", 20)])
        outcomes = []

        def newcomer(pending: int | None) -> None:
            try:
                scheduler.submit([("newcomer", 20)], pending=pending)
                outcomes.append("taken")
            except QueueFull:
                outcomes.append("refused")

        # each pending request counts a median sentence (20): ahead 0.6, 0.62, 0.64 + 0.2, 0.66 + 0.6 s
        for pending in (None, 0, 10, 30):
            newcomer(pending)
        scheduler._queue.take(list(scheduler._queue))  # all of it running now, nothing queued
        scheduler._taken_tokens = 1200  # 1.2 s of work out of the queue and not yet answered
        newcomer(0)  # the edge's rule: behind 1.2 s of work
        newcomer(None)  # weighed at the edge already: an empty queue takes it
        return outcomes

    assert asyncio.run(scenario()) == ["taken", "taken", "taken", "refused", "refused", "taken"]


def test_idle_housekeeping_runs_in_the_graph_thread_when_idle_and_not_too_often() -> None:
    """`on_idle` (the server's malloc_trim) runs after a batch that leaves nothing to run, in the
    graph thread, at most once per `idle_every` seconds."""
    threads: list[str] = []

    async def scenario(idle_every: float) -> int:
        scheduler = Scheduler(
            prepare=lambda p: p,
            run=lambda p: list(p),
            on_idle=lambda: threads.append(threading.current_thread().name),
            idle_every=idle_every,
        )
        scheduler.start()
        for _ in range(3):
            await asyncio.gather(*scheduler.submit([("x", 1)]))
            await asyncio.sleep(0.01)
        await scheduler.stop()
        return len(threads)

    assert asyncio.run(scenario(idle_every=60.0)) == 1
    threads.clear()
    assert asyncio.run(scenario(idle_every=0.0)) == 3
    assert all(name.startswith("graphs") for name in threads)


def test_scheduler_rate_is_taken_from_back_to_back_batches() -> None:
    """A batch that found the graphs idle gives no rate sample (past the first estimate); one that
    waited for the previous batch gives sentences ÷ the time between their ends."""

    async def scenario() -> float:
        now = [0.0]
        scheduler = Scheduler(prepare=lambda p: p, run=lambda p: p, clock=lambda: now[0])
        item = WorkItem("x", 1, 0.01, None, asyncio.get_running_loop().create_future())
        first = scheduler.estimate.cycle_rate(0, [item], 1, finished=0.1, run_seconds=0.05)
        assert first == pytest.approx(20.0)  # the first: its run time
        scheduler.estimate.rates.observe(1, 20.0)
        late = WorkItem("y", 1, 5.0, None, asyncio.get_running_loop().create_future())
        assert scheduler.estimate.cycle_rate(0, [late], 1, finished=5.02, run_seconds=0.02) is None  # after an idle spell
        waiting = [WorkItem("z", 1, 5.01, None, asyncio.get_running_loop().create_future()) for _ in range(4)]
        return scheduler.estimate.cycle_rate(0, waiting, 4, finished=5.1, run_seconds=0.05) or 0.0  # waited since 5.01

    assert asyncio.run(scenario()) == pytest.approx(4 / 0.08)


def test_a_burst_behind_a_slow_lone_first_batch_is_admitted_at_the_warm_up_estimate() -> None:
    """A burst on an idle service: its first request runs alone and slowly (on a CPU the loop parses
    the rest of the burst beside it). From that batch's run time alone (10 sub-words in 0.3 s), the
    19 behind it (190 sub-words, running or queued) look like 3.8 s of work, and the first client's next
    request is refused though they run in a fraction of the bound. Seeded by the warm-up's pass
    (10 sub-words in 10 ms), admission takes it, and the idle batch gives no sample."""

    def run(prepared: list[str]) -> list[str]:
        time.sleep(0.3 if prepared == ["first"] else 0.05)
        return list(prepared)

    async def next_request_refused(seeded: bool) -> bool:
        limits = BatchLimits(max_batch_size=8, max_wait_ms=5, max_queue_seconds=0.5, close_when_idle=True)
        scheduler = Scheduler(prepare=lambda p: p, run=run, limits=limits)
        if seeded:
            scheduler.estimate.first_estimate([(10, 0.01)])
        scheduler.start()
        first = scheduler.submit([("first", 10)])
        await asyncio.sleep(0.05)  # the lone batch is running: the rest of the burst queues
        burst = [future for _ in range(19) for future in scheduler.submit([("other", 10)])]
        await asyncio.gather(*first)
        try:
            refused = False
            burst += scheduler.submit([("next", 10)])
        except QueueFull:
            refused = True
        await asyncio.gather(*burst)
        await scheduler.stop()
        return refused

    assert asyncio.run(next_request_refused(seeded=False))  # the run-time estimate: 50 sub-words/s
    assert not asyncio.run(next_request_refused(seeded=True))


def test_the_first_estimate_counts_the_lanes_that_run_at_once() -> None:
    cpu, device = (
        Scheduler(prepare=list, run=list, lanes=2),
        Scheduler(prepare=list, run=list, lanes=2, lanes_drive_a_device=True),
    )
    for scheduler in (cpu, device):
        scheduler.estimate.first_estimate([(20, 0.01)])
        scheduler.estimate.first_estimate([(20, 1.0)])  # only before anything is measured
    assert (cpu.estimate.rates.at(20), device.estimate.rates.at(20)) == (pytest.approx(4000.0), pytest.approx(2000.0))


def test_with_lanes_a_cycle_counts_for_every_lane() -> None:
    """Back to back in one lane while the other runs too: the capacity is the lanes' together,
    each lane timed from its own previous batch."""

    async def scenario() -> float | None:
        scheduler = Scheduler(prepare=lambda p: p, run=lambda p: p, lanes=2)
        future = asyncio.get_running_loop().create_future
        scheduler.estimate.rates.observe(1, 1.0)
        scheduler.estimate.cycle_rate(0, [WorkItem("a", 10, 0.5, None, future())], 10, finished=1.0, run_seconds=0.5)
        scheduler.estimate.cycle_rate(1, [WorkItem("b", 10, 0.6, None, future())], 10, finished=1.5, run_seconds=0.9)
        return scheduler.estimate.cycle_rate(0, [WorkItem("c", 10, 0.7, None, future())], 10, finished=2.0, run_seconds=1.0)

    # lane 0 from its own previous end (1.0), not lane 1's (1.5), and for both lanes
    assert asyncio.run(scenario()) == pytest.approx(2 * 10 / 1.0)


def test_lanes_run_batches_at_once_and_share_the_queue() -> None:
    """Two lanes: two batches in the graphs at the same time, each in a graph thread of its own set
    up once, and a queue that finds both lanes free is split between them, not sent as one batch."""
    sizes: list[int] = []
    set_up: list[str] = []
    ran_in: set[str] = set()
    inside = threading.Barrier(2, timeout=5)

    def run(prepared: list[str]) -> list[str]:
        sizes.append(len(prepared))
        ran_in.add(threading.current_thread().name)
        inside.wait()  # returns only once the other lane's batch is running too
        return [p.upper() for p in prepared]

    def lane_setup() -> None:
        set_up.append(threading.current_thread().name)

    async def scenario() -> list[str]:
        limits = BatchLimits(max_batch_size=8, max_wait_ms=20)
        scheduler = Scheduler(prepare=lambda p: p, run=run, limits=limits, lanes=2, lane_setup=lane_setup)
        scheduler.start()
        results = [r.value for r in await asyncio.gather(*scheduler.submit([(str(i), 3) for i in range(8)]))]
        await scheduler.stop()
        return results

    assert asyncio.run(scenario()) == [str(i) for i in range(8)]
    assert sizes == [4, 4]
    # each lane's graph thread set up once as it started (a CUDA stream of its own on a GPU)
    assert sorted(set_up) == sorted(ran_in) and len(ran_in) == 2
    assert all(name.startswith("graphs") for name in ran_in)


def test_rates_are_kept_by_batch_size() -> None:
    """A queue is estimated at the rate of the batches it would form: between two measured sizes,
    along the line between their times; beyond the largest, the largest's rate; below the smallest,
    the smallest's; nothing measured gives 0 (nothing is refused)."""
    from nerserve.service.batching.rates import SMOOTHING, BatchRates

    rates = BatchRates(max_batch_tokens=32)
    assert not rates and rates.at(10) == 0.0
    rates.observe(2, 80.0)  # 25 ms
    rates.observe(32, 140.0)  # 228.6 ms
    assert rates.at(1) == 80.0  # batches of 1 never measured: not the faster full batches' rate
    assert rates.at(17) == pytest.approx(17 / (0.025 + (32 / 140 - 0.025) / 2))  # halfway in time
    assert rates.at(32) == pytest.approx(140.0) and rates.at(500) == pytest.approx(140.0)  # beyond: full batches
    rates.observe(40, 100.0)  # counted as a full batch
    assert rates.at(64) == pytest.approx((1 - SMOOTHING) * 140.0 + SMOOTHING * 100.0)


def test_a_device_with_a_fixed_cost_is_estimated_between_its_lone_and_full_passes() -> None:
    """On a GPU a lone sentence's pass (14 ms for 14 sub-words) and a full batch's (400 ms for
    65,536) say a burst of 256 sentences runs in about 0.1 s; the lone sentence's rate alone said
    3.6 s, and refused it. The batches a queue forms hold max_batch_size sentences at most."""

    async def scenario() -> tuple[float, float]:
        limits = BatchLimits(max_batch_size=256, max_batch_tokens=65_536, max_queue=100_000, max_queue_seconds=100.0)
        scheduler = Scheduler(prepare=list, run=list, limits=limits, lanes=2, lanes_drive_a_device=True)
        scheduler.estimate.first_estimate([(14, 0.014), (65_536, 0.4)])
        for _ in range(256):  # a burst of 256 requests of one sentence
            scheduler.submit([("a", 14)])
        burst = scheduler.wait([14]).others
        for _ in range(10_000 - 256):  # a backlog: batches of 256 sentences, each at their own rate
            scheduler.submit([("b", 14)])
        return burst, scheduler.wait([14]).others

    burst, backlog = asyncio.run(scenario())
    per_batch = 0.014 + (0.4 - 0.014) * (256 * 14 - 14) / (65_536 - 14)  # 35 ms
    assert burst == pytest.approx(per_batch)
    assert backlog == pytest.approx(10_000 / 256 * per_batch)


def test_pass_times_run_along_the_line_between_measured_sizes() -> None:
    """A size not run yet is estimated between its measured neighbours; below the smallest, at the
    smallest's time; beyond the largest, along the line through the two largest."""
    from nerserve.service.batching.rates import PassTimes

    times = PassTimes()
    assert not times and times.seconds(10) == 0.0 and not times.has_run(1)
    times.observe(20, 0.013)
    assert times.seconds(5) == 0.013 and times.seconds(40) == pytest.approx(0.026)  # one size: by sub-words
    times.observe(4800, 0.029)
    assert times.seconds(2410) == pytest.approx(0.021)
    assert times.seconds(9580) == pytest.approx(0.045)
    assert times.has_run(4000) and times.has_run(8191 // 2) and not times.has_run(8192)


def test_a_devices_second_lane_queues_its_pass_behind_the_first_and_times_only_its_own() -> None:
    """On a device the second lane launches the next batch while the first runs: queued behind it,
    it ends a pass later, and the pass time learnt from it is its own (100 ms), not its wait too."""
    from nerserve.ner.runtime.simulated import SimulatedDevice

    device = SimulatedDevice("card", "test", np.array([1.0, 100.0]), np.array([100.0, 100.0]))
    ended: dict[str, float] = {}

    def run(prepared: list[str]) -> list[str]:
        device.run(len(prepared))
        ended[prepared[0]] = time.monotonic()
        return prepared

    async def scenario() -> Scheduler:
        limits = BatchLimits(max_wait_ms=1, close_when_idle=True, close_as_device_frees=True)
        scheduler = Scheduler(prepare=lambda p: p, run=run, limits=limits, lanes=2, lanes_drive_a_device=True)
        scheduler.start()
        first = scheduler.submit([("a", 1)])
        await asyncio.sleep(0.02)  # a runs; b gathers, is prepared and launched behind it
        await asyncio.gather(*first, *scheduler.submit([("b", 1)]))
        await scheduler.stop()
        return scheduler

    scheduler = asyncio.run(asyncio.wait_for(scenario(), timeout=10))
    assert 0.09 <= ended["b"] - ended["a"] < 0.15  # b ran right after a, not after a and a turn of the loop
    assert scheduler.times.run.seconds(1) == pytest.approx(0.1, abs=0.01)


def closed_loop(
    sentences: list[float],
    milliseconds: list[float],
    clients: int = 16,
    prepare_ms: float = 0.0,
    batch_limit: int = 32,
    max_wait_ms: float = 5.0,
    per_request: int = 1,
    staggered: bool = False,
    closed: list[str] | None = None,
    resend_ms: Callable[[int], float] = lambda client: 0.0,
    lane_wait_ms: Callable[[int], float] = lambda sentences: 0.0,
    device_clock: bool = False,
) -> tuple[list[int], float]:
    """The sizes of the passes a simulated device of these costs ran for CLIENTS clients that each
    send a request of PER_REQUEST sentences again once answered, for 1.6 s, after a request alone
    (whose pass tells the scheduler what a small pass costs), and the share of that time the device
    was busy once every client had started; a batch's prepare takes PREPARE_MS. STAGGERED: each
    client starts once the one before has had a pass on the device. CLOSED: filled with why each
    batch closed (BatchRecord.closed), in order. RESEND_MS: how long client i takes to send again
    once answered (its share of the way back through the front). LANE_WAIT_MS: how long a pass of
    so many sentences keeps its lane after the device is done with it (a lane's thread waiting for
    the interpreter lock); DEVICE_CLOCK: the scheduler reads the device's own clock for a pass."""
    from nerserve.ner.runtime.simulated import SimulatedDevice

    class Reasons(NullObserver):
        def batch_done(self, record: BatchRecord) -> None:
            if closed is not None:
                closed.append(record.closed)

    device = SimulatedDevice("card", "test", np.array(sentences), np.array(milliseconds))
    passes: list[int] = []
    busy: list[float] = []

    def run(prepared: list[str]) -> list[str]:
        passes.append(len(prepared))
        device.run(len(prepared))
        time.sleep(lane_wait_ms(len(prepared)) / 1000)
        return prepared

    def prepare(payloads: list[str]) -> list[str]:
        time.sleep(prepare_ms / 1000)
        return payloads

    async def client(scheduler: Scheduler, number: int, until: float) -> None:
        while time.monotonic() < until:
            await asyncio.gather(*scheduler.submit([(f"s{number}.{index}", 1) for index in range(per_request)]))
            if resend_ms(number):
                await asyncio.sleep(resend_ms(number) / 1000)

    async def scenario() -> None:
        limits = BatchLimits(
            max_batch_size=batch_limit, max_wait_ms=max_wait_ms, close_when_idle=True, close_as_device_frees=True
        )
        scheduler = Scheduler(
            prepare=prepare,
            run=run,
            limits=limits,
            observer=Reasons(),
            answer_per_turn=False,
            lanes=2,
            lanes_drive_a_device=True,
            pass_clock=device.pass_clock if device_clock else None,
        )
        scheduler.start()
        await asyncio.gather(*scheduler.submit([("first", 1)]))
        until = time.monotonic() + 1.6
        running = []
        for index in range(clients):
            running.append(asyncio.create_task(client(scheduler, index, until)))
            passes_before = len(passes)
            while staggered and len(passes) == passes_before:
                await asyncio.sleep(0.001)
        busy_before, started = device.busy_seconds, time.monotonic()
        await asyncio.gather(*running)
        busy.append((device.busy_seconds - busy_before) / (time.monotonic() - started))
        await scheduler.stop()

    asyncio.run(asyncio.wait_for(scenario(), timeout=20))
    return passes, busy[0]


# A pass time measured on a busy machine may stray (a lane's thread woken late): the scheduler then
# splits or rejoins a batch or two, as it should by what it measured. A closed loop travels in halves
# where most of its settled passes (its second half) are below the whole batch, and whole where few are.
HALVES_SHARE = 0.75


def share_in_halves(passes: list[int], whole: int = 16) -> float:
    """The share of the settled passes (the second half of PASSES) smaller than WHOLE."""
    settled = passes[len(passes) // 2 :]
    assert settled, "no pass settled"
    return sum(size < whole for size in settled) / len(settled)


def assert_settled_in_halves(passes: list[int], split: bool) -> None:
    """Most settled passes below the whole batch where SPLIT, few where not (HALVES_SHARE)."""
    halves = share_in_halves(passes)
    assert halves >= HALVES_SHARE if split else halves <= 1 - HALVES_SHARE


@pytest.mark.parametrize("fixed_ms, split", [(20.0, True), (60.0, False)])
def test_on_a_device_a_closed_loop_travels_in_halves_where_halves_cost_it_little_more(fixed_ms: float, split: bool) -> None:
    """Sixteen clients that each send again once answered travel as one batch at first. Where a
    pass costs mostly by its sentences (20 ms fixed, 80 ms for 16), they go on in two halves of 8
    that alternate, one on the device while the host turns the other around; where its fixed part
    dominates (60 of 80 ms: two halves would cost 1.7 times the whole) they stay one batch."""
    passes, _ = closed_loop([1.0, 16.0], [fixed_ms, 80.0])
    # halves: 8 and 8, or a late host's uneven parts (each split again as the device idles)
    assert_settled_in_halves(passes, split)


def test_each_batch_says_why_it_closed() -> None:
    """The lone first request on an idle device closes at once (idle); the closed loop split in
    halves that follows has batches closed as halves; every reason is one of the five that
    /metrics counts (nerserve_batches_closed_total), none left unsaid."""
    reasons: list[str] = []
    closed_loop([1.0, 16.0], [20.0, 80.0], closed=reasons)
    assert reasons[0] == "idle" and "halves" in reasons
    assert set(reasons) <= {"full", "idle", "company", "clients_back", "waited", "halves"}, set(reasons)


@pytest.mark.parametrize(
    "pass_ms, in_flight, waits",
    [
        ((10.0, 11.0), 4, True),  # launch-bound: the loop's 16 cost little more than the 4 queued
        ((1.0, 16.0), 4, False),  # a pass costs by sentence: the 4 go at once
        ((10.0, 11.0), 16, False),  # the whole loop is in flight: nothing to wait for
    ],
)
def test_an_idle_device_waits_for_the_rest_of_a_closed_loop_where_a_pass_costs_mostly_its_launches(
    pass_ms: tuple[float, float], in_flight: int, waits: bool
) -> None:
    """A load of 16 sentences in flight at once over the last batches, 4 of them queued on an idle
    device (the first of a closed loop's clients back). Where a pass of 16 costs less than two of 4
    (10 ms for one sentence, 11 for sixteen: a GPU launching a small batch's kernels one by one from
    Python) the batch waits for the rest: until a pass of its own, at most max_wait (5 ms), after
    its first sentence came. Where passes cost by the sentence, or the whole load is in flight, it
    closes at once."""

    async def company_until() -> tuple[float | None, float]:
        limits = BatchLimits(max_batch_size=32, close_when_idle=True, close_as_device_frees=True)
        scheduler = Scheduler(prepare=lambda p: p, run=lambda p: p, limits=limits, lanes=2, lanes_drive_a_device=True)
        for sentences, milliseconds in zip((1, 16), pass_ms, strict=True):
            scheduler.times.run.observe(sentences, milliseconds / 1000)
        scheduler.closing.populations.append(16)
        scheduler.submit([(f"s{index}", 1) for index in range(4)])
        if in_flight > 4:
            scheduler.submit([(f"t{index}", 1) for index in range(in_flight - 4)])
        return scheduler.closing.company_until(scheduler.in_flight), scheduler._queue.oldest_arrival()

    until, first_arrival = asyncio.run(company_until())
    if waits:
        assert until == pytest.approx(first_arrival + 0.005)
    else:
        assert until is None


def test_a_batch_split_in_halves_is_measured_as_it_ran() -> None:
    """15 sentences queued on an idle device whose passes of 1, 8 and 16 ran at 10, 10.5 and 11 ms:
    halves of 8 and 7 would cost the device twice a whole pass, so they stay whole. (Judged by half
    of 15, 7.5, a size no batch had run, the halves were tried again and again: the first half, 8,
    never measured 7.5's size, and the closed loop stayed split.)"""

    async def size_limit_taken() -> int:
        limits = BatchLimits(max_batch_size=16, close_when_idle=True, close_as_device_frees=True)
        scheduler = Scheduler(prepare=lambda p: p, run=lambda p: p, limits=limits, lanes=2, lanes_drive_a_device=True)
        for sentences, milliseconds in [(1, 10.0), (8, 10.5), (16, 11.0)]:
            scheduler.times.run.observe(sentences, milliseconds / 1000)
            scheduler.times.device.observe(sentences, milliseconds / 1000)
            scheduler.times.prepare.observe(sentences, 0.0005)
        scheduler.submit([(f"s{index}", 1) for index in range(15)])
        return scheduler.closing.pipelined_limits(limits).max_batch_size

    assert asyncio.run(size_limit_taken()) == 16


def test_an_idle_device_does_not_wait_for_clients_that_are_not_coming() -> None:
    """The same device with one client: all of the load is in flight, so its request goes at once
    (closed as idle) and never waits for company."""
    reasons: list[str] = []
    passes, _ = closed_loop([1.0, 16.0], [10.0, 11.0], clients=1, closed=reasons)
    assert set(passes) == {1} and set(reasons) == {"idle"}


@pytest.mark.parametrize("batch_limit, split", [(16, True), (32, False)])
def test_a_full_batch_goes_in_halves_where_the_host_is_slower_than_a_half_pass(batch_limit: int, split: bool) -> None:
    """A host that takes longer to turn a half around (a prepare of 7 ms, counted twice for busy
    cores, and the hand-off) than the device takes for a half pass (8 ms for one sentence, 20 ms for
    16: about 14 ms for 8). Where the 16 clients fill the device's batch limit they go in halves: one
    batch leaves the device idle for the whole of the host's turn, two leave it idle only for what
    the host takes beyond the other half's pass. Where they do not fill it (a batch limit of 32),
    nothing says the clients are waiting on this batch rather than arriving slowly: one batch. Two
    halves cost the device 28 ms against 1.5 × 20: passes are timed by the device's own clock, as on
    a card, since by a lane's clock a wake-up late by a millisecond on a busy machine makes them dear."""
    passes, _ = closed_loop([1.0, 16.0], [8.0, 20.0], prepare_ms=7.0, batch_limit=batch_limit, device_clock=True)
    assert_settled_in_halves(passes, split)


@pytest.mark.parametrize("batch_limit, prepare_ms, size_limit", [(16, 7.0, 8), (32, 7.0, 32), (32, 2.0, 8)])
def test_the_halves_rule_by_pass_and_prepare_times_alone(batch_limit: int, prepare_ms: float, size_limit: int) -> None:
    """The rule of the closed loops above, from pass and prepare times set rather than measured: 16
    sentences queued on an idle device whose two half passes (13.6 ms each) cost 1.36 times the
    whole (20 ms). With a 7-ms prepare the host's turn of a half (twice the prepare and the hand-off)
    is longer than a half pass: halves where the 16 fill the batch limit (16), the limit kept where
    they do not (32). With a 2-ms prepare the host keeps up: halves either way."""

    async def size_limit_taken() -> int:
        limits = BatchLimits(max_batch_size=batch_limit, close_when_idle=True, close_as_device_frees=True)
        scheduler = Scheduler(prepare=lambda p: p, run=lambda p: p, limits=limits, lanes=2, lanes_drive_a_device=True)
        for sentences, milliseconds in [(1, 8.0), (8, 13.6), (16, 20.0)]:
            scheduler.times.run.observe(sentences, milliseconds / 1000)
            scheduler.times.device.observe(sentences, milliseconds / 1000)
            scheduler.times.prepare.observe(sentences, prepare_ms / 1000)
        scheduler.submit([(f"s{index}", 1) for index in range(16)])
        return scheduler.closing.pipelined_limits(limits).max_batch_size

    assert asyncio.run(size_limit_taken()) == size_limit


def test_a_half_whose_clients_are_back_closes_without_waiting_out_max_wait() -> None:
    """Sixteen clients fill a batch limit of 16 and go in two alternating halves of 8 (8 ms for one
    sentence, 20 ms for 16: about 14 ms for 8), each prepared in 7 ms, with a max_wait of 100 ms.
    A half's clients are all back while the other half runs: its batch closes then, is prepared
    during that pass, and starts as the device frees, which stays busy. Were it to wait for more
    company until the device freed, the device would then idle through every prepare. (Passes timed
    by the device's own clock, as in the test above.)"""
    passes, busy = closed_loop([1.0, 16.0], [8.0, 20.0], prepare_ms=7.0, batch_limit=16, max_wait_ms=100.0, device_clock=True)
    assert_settled_in_halves(passes, split=True)
    assert busy >= 0.8


def test_a_batch_as_large_as_the_one_on_the_device_closes_once_its_clients_are_back() -> None:
    """Two clients of 8 sentences a request take turns on the device, never split in halves (8 of
    a batch limit of 32 is not full): so two HTTP workers' clients travel, each worker's answers in
    one message. A pass of 8 takes about 14 ms and a prepare 7 ms, max_wait is 100 ms. The turn
    gathering closes once its 8 are back and is prepared during the other's pass, which keeps the
    device busy; were it to gather on until the device freed, the device would idle through each
    prepare (about 0.65 busy)."""
    passes, busy = closed_loop(
        [1.0, 16.0], [8.0, 20.0], clients=2, prepare_ms=7.0, max_wait_ms=100.0, per_request=8, staggered=True
    )
    assert all(size == 8 for size in passes[1:])  # turns of 8, never joined or split
    assert busy >= 0.8


def test_a_split_is_forgotten_once_a_batch_holds_more_than_the_batch_split() -> None:
    """A closed loop of 4 once went in halves; 20 sentences queued now are another load: the batch
    takes all 20 and the split is forgotten, so that no later batch waits for an idle device to
    rejoin halves of a load gone (`_rejoin_halves`)."""

    async def taken_and_split() -> tuple[int, float | None]:
        limits = BatchLimits(max_batch_size=32, close_when_idle=True, close_as_device_frees=True)
        scheduler = Scheduler(prepare=lambda p: p, run=lambda p: p, limits=limits, lanes=2, lanes_drive_a_device=True)
        scheduler.closing.split_whole = 4.0
        scheduler.submit([(f"s{index}", 1) for index in range(20)])
        batch, _ = await scheduler._wait_for_batch()
        return len(batch), scheduler.closing.split_whole

    assert asyncio.run(taken_and_split()) == (20, None)


@pytest.mark.parametrize("half_ms, split", [(42.0, True), (55.0, False)])
def test_a_half_never_run_is_tried_once_then_kept_or_rejoined_by_its_measured_cost(half_ms: float, split: bool) -> None:
    """A device whose pass costs 40 ms for one sentence and 60 ms for 16: between those two sizes,
    the only ones run, a half of 8 looks like 49 ms, and two of them too dear (99 ms against 1.5 ×
    60). The closed loop is tried once in halves to measure them. Where a half costs 42 ms (84
    against 90) the halves stay; where it costs 55 ms (110) they are rejoined into one batch."""
    passes, _ = closed_loop([1.0, 8.0, 16.0], [40.0, half_ms, 60.0])
    assert 8 in passes[: len(passes) // 2]  # the halves were tried
    assert_settled_in_halves(passes, split)


@pytest.mark.parametrize("device_clock, split", [(True, True), (False, False)])
def test_halves_are_judged_by_the_devices_own_clock_where_it_has_one(device_clock: bool, split: bool) -> None:
    """The device of the test above with halves that pay (40 ms for one sentence, 42 for 8, 60 for
    16: two halves 84 ms against 1.5 x 60), and a half's lane kept 15 ms past its pass, as a lane
    waits for the interpreter while the host turns the other half around (a whole pass has an idle
    host beside it). By the lanes' clocks a half costs 57 ms and two of them more than 1.5 wholes:
    the loop is rejoined. By the device's own clock the halves stay."""
    passes, _ = closed_loop(
        [1.0, 8.0, 16.0],
        [40.0, 42.0, 60.0],
        lane_wait_ms=lambda sentences: 15.0 if 1 < sentences < 16 else 0.0,
        device_clock=device_clock,
    )
    assert 8 in passes[: len(passes) // 2]  # the halves were tried
    assert_settled_in_halves(passes, split)


def test_a_burst_is_estimated_at_the_rate_of_full_batches() -> None:
    """Below capacity a server runs small batches; a burst's queue forms full ones, which run
    faster a sentence: 100 sentences ahead wait 100 / 140 s, not 100 / 80 s, and are admitted
    under a 1-s bound."""

    async def scenario() -> int:
        scheduler = make_scheduler(BatchLimits(max_queue=10_000, max_queue_seconds=1.0))
        scheduler.estimate.rates.observe(2, 80.0)  # the small batches of a calm spell
        scheduler.estimate.rates.observe(32, 140.0)  # full batches, measured in an earlier burst
        scheduler.submit([("a", 1)] * 100)
        scheduler.submit([("b", 1)] * 1)  # 1 of a's ahead in fair order
        scheduler.submit([("c", 1)] * 100)  # 100 of a's, b's 1: 0.72 s at 140/s (1.26 s at 80/s)
        return scheduler.depth

    assert asyncio.run(scenario()) == 201


def test_a_request_waits_for_all_its_sentences_or_the_first_failure_or_its_client() -> None:
    """What a request's sentences are followed with: every result in order, answered once; the
    first failure at once; the client gone, or the awaiting task cancelled: every sentence not yet
    answered is done, so that the batcher drops it. A caller whose callback fails does not fail
    the batcher that answers."""
    from nerserve.service.api.errors import ApiError
    from nerserve.service.api.extraction import PlannedRun, UnitAnswers, settled
    from nerserve.service.batching.work import Answer, ItemResult

    def result(value: int | str, batch: int = 0) -> ItemResult:
        return ItemResult(value, queue_seconds=0.1 * batch, run_seconds=0.5, batch_id=batch)

    async def follow(sentences: int, gone: asyncio.Future[None], answer: Callable[[list[Answer]], None]) -> UnitAnswers:
        outcomes: list[UnitAnswers | BaseException] = []

        def start(on_done: Callable[[UnitAnswers | BaseException], None]) -> PlannedRun:
            run = PlannedRun(sentences, {"person"}, lambda outcome: (outcomes.append(outcome), on_done(outcome)))
            runs.append(run.answers())
            answer(runs[-1])
            return run

        try:
            return await settled(start, gone)
        finally:
            assert len(outcomes) <= 1

    runs: list[list[Answer]] = []  # each request's answers, as the batcher holds them

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        never_gone: asyncio.Future[None] = loop.create_future()
        assert (await follow(0, never_gone, lambda answers: None)).entities == []

        def in_reverse(answers: list[Answer]) -> None:
            for index, answer in enumerate(reversed(answers)):
                loop.call_later(0.01 * index, answer.set_result, result(len(answers) - 1 - index, batch=index % 2))

        answers = await follow(3, never_gone, in_reverse)
        assert answers.entities == [0, 1, 2] and answers.wanted == {"person"}
        assert answers.queue_seconds == pytest.approx(0.1) and answers.inference_seconds == pytest.approx(1.0)

        # a lone sentence's run is its own slot: its answer settles it at once, once
        lone = await follow(1, never_gone, lambda answers: loop.call_soon(answers[0].set_result, result("one", batch=2)))
        assert lone.entities == ["one"] and lone.queue_seconds == pytest.approx(0.2) and lone.inference_seconds == 0.5
        assert runs[-1][0].done()
        runs[-1][0].set_result(result("again"))  # answered already: ignored
        with pytest.raises(ApiError) as lone_late:
            await follow(1, never_gone, lambda answers: loop.call_soon(answers[0].set_exception, DeadlineExceeded()))
        assert lone_late.value.code == "deadline_exceeded" and runs[-1][0].done()

        def second_one_late(answers: list[Answer]) -> None:
            loop.call_soon(answers[1].set_exception, DeadlineExceeded())

        with pytest.raises(ApiError) as late:
            await follow(3, never_gone, second_one_late)
        assert late.value.code == "deadline_exceeded"
        failing = runs[-1]
        assert not failing[0].done()  # its other sentences still run, their answers ignored
        failing[0].set_exception(RuntimeError("graphs failed"))
        failing[2].set_result(result("late"))

        def first_one_done(answers: list[Answer]) -> None:
            answers[0].set_result(result("done"))

        gone: asyncio.Future[None] = loop.create_future()
        loop.call_soon(gone.set_result, None)
        with pytest.raises(ApiError) as refused:
            await follow(2, gone, first_one_done)
        assert refused.value.code == "client_gone" and runs[-1][1].done()

        task = asyncio.create_task(follow(1, never_gone, lambda answers: None))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert runs[-1][0].done()

        def broken(outcome: object) -> None:
            raise RuntimeError("the caller's own fault")

        PlannedRun(1, None, broken).answers()[0].set_result(result("x"))  # logged, not raised

    asyncio.run(scenario())


def test_a_batch_record_holds_its_way_through_the_scheduler_in_order() -> None:
    """BatchRecord.times: closed, handed to the lanes, taken, its own pass, answered, in that order;
    on a device whose two lanes queue their passes, a pass starts no sooner than the one before it
    ended (its own time is from then)."""
    records: list[BatchRecord] = []

    class Recorder(NullObserver):
        def batch_done(self, record: BatchRecord) -> None:
            records.append(record)

    device = threading.Lock()  # a device runs one pass at a time, whichever lane launched it

    def run(prepared: list[str]) -> list[str]:
        with device:
            time.sleep(0.004)
        return prepared

    async def scenario(on_a_device: bool) -> None:
        limits = BatchLimits(max_batch_size=4, max_wait_ms=1, close_when_idle=True, close_as_device_frees=on_a_device)
        scheduler = Scheduler(
            prepare=lambda payloads: payloads, run=run, limits=limits, observer=Recorder(), lanes=2,
            lanes_drive_a_device=on_a_device,
        )  # fmt: skip
        scheduler.start()
        await asyncio.gather(*(asyncio.gather(*scheduler.submit([(f"s{i}", 1)])) for i in range(24)))
        await scheduler.stop()

    for on_a_device in (True, False):
        records.clear()
        asyncio.run(asyncio.wait_for(scenario(on_a_device), timeout=20))
        assert sum(record.sentences for record in records) == 24
        for record in records:
            times = record.times
            assert times is not None and record.lane in (0, 1)
            assert times.closed <= times.handed <= times.taken <= times.started <= times.finished <= times.answered
            assert record.run_seconds == pytest.approx(times.finished - times.started)
        if on_a_device:
            passes = sorted((record.times.started, record.times.finished) for record in records if record.times)
            assert all(start >= end_before for (_, end_before), (start, _) in itertools.pairwise(passes))
