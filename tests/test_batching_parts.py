"""The scheduler's parts on their own: the graph lanes' threads, the lanes' times, admission's estimate."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from nerserve.service.batching.estimate import AdmissionEstimate
from nerserve.service.batching.lanes import GraphLanes, LanePass
from nerserve.service.batching.packing import BatchLimits
from nerserve.service.batching.timing import HAND_OFF_SECONDS, LaneTimes
from nerserve.service.batching.work import PreparedBatch, WorkItem


def _batch(loop: asyncio.AbstractEventLoop, *payloads: str) -> PreparedBatch:
    items = [WorkItem(payload, 1, 0.0, None, loop.create_future()) for payload in payloads]
    return PreparedBatch(items, list(payloads), len(items))


def test_a_lane_reports_each_batch_taken_then_run_on_the_loop_from_a_thread_of_its_own() -> None:
    async def scenario() -> tuple[list[tuple[str, Any]], set[str]]:
        loop = asyncio.get_running_loop()
        events: list[tuple[str, Any]] = []
        threads: set[str] = set()
        done = asyncio.Event()

        def run(prepared: list[str]) -> list[str]:
            threads.add(threading.current_thread().name)
            return [text.upper() for text in prepared]

        def ran(outcome: LanePass) -> None:
            events.append(("ran", outcome.outputs))
            done.set()

        lanes = GraphLanes(1, run, took=lambda lane, work, started: events.append(("took", work.prepared)), ran=ran)
        lanes.start(loop)
        lanes.hand(_batch(loop, "a", "b"))
        await asyncio.wait_for(done.wait(), 5)
        assert await lanes.call(lambda: threading.current_thread().name) == "graphs_0"
        lanes.stop()
        return events, threads

    events, threads = asyncio.run(scenario())
    assert events == [("took", ["a", "b"]), ("ran", ["A", "B"])]
    assert threads == {"graphs_0"}


def test_a_batch_nobody_waits_for_is_not_run_and_a_failed_pass_is_reported() -> None:
    async def scenario() -> list[LanePass]:
        loop = asyncio.get_running_loop()
        outcomes: list[LanePass] = []
        both = asyncio.Event()

        def run(prepared: list[str]) -> list[str]:
            raise ValueError(f"bad {prepared}")

        def ran(outcome: LanePass) -> None:
            outcomes.append(outcome)
            if len(outcomes) == 2:
                both.set()

        lanes = GraphLanes(1, run, took=lambda lane, work, started: None, ran=ran)
        gone: asyncio.Future[Any] = loop.create_future()
        gone.cancel()  # its client went away
        abandoned = PreparedBatch([WorkItem("gone", 1, 0.0, None, gone)], ["gone"], 1)
        lanes.start(loop)
        lanes.hand(abandoned)
        lanes.hand(_batch(loop, "x"))
        await asyncio.wait_for(both.wait(), 5)
        lanes.stop()
        return outcomes

    gone, failed = asyncio.run(scenario())
    assert (gone.wanted, gone.error) == (False, None)
    assert failed.wanted and isinstance(failed.error, ValueError)


def test_stopping_the_lanes_returns_what_no_lane_took_and_cancels_their_calls() -> None:
    async def scenario() -> tuple[list[str], bool]:
        loop = asyncio.get_running_loop()
        lanes = GraphLanes(1, list, took=lambda lane, work, started: None, ran=lambda outcome: None)
        lanes.hand(_batch(loop, "a", "b"))  # never started: nothing is taken
        call = asyncio.ensure_future(lanes.call(lambda: "never"))
        await asyncio.sleep(0)
        left = lanes.stop()
        with pytest.raises(asyncio.CancelledError):
            await call
        return [item.payload for item in left], call.cancelled()

    assert asyncio.run(scenario()) == (["a", "b"], True)


def test_the_next_batch_gathers_until_the_device_frees_or_the_first_cpu_lane_does() -> None:
    def gathering(one_device: bool) -> float:
        times = LaneTimes(lanes=2, one_device=one_device)
        times.run.observe(10, 0.010)
        times.prepare.observe(10, 0.001)
        times.ends = {0: 1.020, 1: 1.050}
        return times.gathering_time(10, now=1.0)

    start = 2 * 0.001 + HAND_OFF_SECONDS  # a prepare shares the cores: twice its time, and the hand-off
    assert gathering(one_device=True) == pytest.approx(0.050 - start)  # behind the last pass queued
    assert gathering(one_device=False) == pytest.approx(0.020 - start)  # as the first lane frees


def test_a_devices_pass_is_timed_from_the_end_of_the_one_queued_before_it() -> None:
    times = LaneTimes(lanes=2, one_device=True)
    assert times.ran(10, started=0.0, finished=0.010, device_seconds=None) == 0.0
    # launched at 0.002 behind the first pass: its own time begins when that one ended
    assert times.ran(10, started=0.002, finished=0.018, device_seconds=None) == pytest.approx(0.010)
    # a pass on a stream of its own that ends before the last one's end: no time of its own
    assert times.ran(10, started=0.003, finished=0.015, device_seconds=None) == pytest.approx(0.015)
    assert times.device_free_at == pytest.approx(0.018)


def test_the_typical_sentence_is_the_median_of_a_sample_of_the_requests() -> None:
    estimate = AdmissionEstimate(BatchLimits())
    sizes = [10, 90, 90, 90, 20, 90, 90, 90, 30, 90, 90, 90]
    for size in sizes:  # one-sentence requests
        estimate.accepted(size, 1)
    assert estimate.typical_sentence == 20  # the median of 10, 20 and 30: every fourth request's
