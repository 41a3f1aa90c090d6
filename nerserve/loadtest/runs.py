"""Closed-loop and open-loop runs: bounded in count and time, against one model."""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

import aiohttp

from nerserve.loadtest.client import Sample, extract, scrape, server_split
from nerserve.loadtest.schedule import arrivals
from nerserve.loadtest.stats import summarize

MAX_OUTSTANDING = 4096  # open loop: beyond this many unanswered requests the client itself is saturated
GOODPUT_WITHIN_SECONDS = 2.0  # goodput counts the 200s answered within this long of being due


def summarize_run(samples: list[Sample], seconds: float, label: dict[str, Any], window: float | None = None) -> dict[str, Any]:
    """`window`: the offered window (open loop), which goodput is per second of."""
    first = min((s.scheduled for s in samples), default=0.0)
    ok = [s for s in samples if s.status == 200]
    good = [s for s in ok if s.latency <= GOODPUT_WITHIN_SECONDS]
    statuses: dict[str, int] = {}
    for s in samples:
        statuses[str(s.status)] = statuses.get(str(s.status), 0) + 1
    return {
        **label,
        "seconds": seconds,
        "requests": len(samples),
        "ok": len(ok),
        "errors": len(samples) - len(ok),
        "status_counts": statuses,
        "http_429": statuses.get("429", 0),
        "sentences_per_second": sum(s.sentences for s in ok) / seconds if seconds else 0.0,
        "goodput_sentences_per_second": sum(s.sentences for s in good) / (window or seconds) if seconds else 0.0,
        "ok_later_than_goodput_bound": len(ok) - len(good),
        "words_per_second": sum(s.words for s in ok) / seconds if seconds else 0.0,
        "latency_ms": summarize([s.latency for s in ok]),
        # how fast the excess is refused: admission control answers 429 at the door
        "rejected_latency_ms": summarize([s.latency for s in samples if s.status == 429]),
        # every request (due offset, latency, status, server queue ms): where a tail comes from
        "samples": [
            [round(s.scheduled - first, 4), round(s.latency, 4), s.status, s.queue_ms, s.inference_ms] for s in samples
        ],
    }


async def closed_loop(
    client: aiohttp.ClientSession,
    model: str,
    sentences: list[list[str]],
    concurrency: int,
    duration: float,
    per_request: int = 1,
    once: bool = False,
    route: str = "extract",
) -> dict[str, Any]:
    """`concurrency` workers, each sending its next request when the previous one returns, or,
    refused (429), once the Retry-After it was given has passed, as a well-behaved client does: a
    worker that resent at once would measure a storm of refusals (each one answered on the cores
    the graphs need), not the service's throughput under that many clients. `once`: every request
    of the split is answered exactly once (a refused one is sent again), then the run ends, so that
    two servers are compared on the same sentences; `duration` caps it."""
    requests = [sentences[i : i + per_request] for i in range(0, len(sentences), per_request)]
    batches = iter(requests) if once else itertools.cycle(requests)
    samples: list[Sample] = []
    before = await scrape(client)
    start = time.perf_counter()
    end = start + duration

    async def worker() -> None:
        batch = next(batches, None)
        while batch is not None and time.perf_counter() < end:
            sample = await extract(client, model, batch, route=route)
            samples.append(sample)
            if sample.status == 429:
                await asyncio.sleep(min(sample.retry_after or 1.0, max(0.0, end - time.perf_counter())))
                if once:
                    continue
            batch = next(batches, None)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    seconds = time.perf_counter() - start
    after = await scrape(client)
    label = {"mode": "closed", "model": model, "route": route, "concurrency": concurrency, "sentences_per_request": per_request}
    return {**summarize_run(samples, seconds, label), **server_split(before, after, model, seconds)}


async def open_loop(
    client: aiohttp.ClientSession,
    model: str,
    sentences: list[list[str]],
    rate: float,
    duration: float,
    kind: str = "poisson",
    per_request: int = 1,
    seed: int = 0,
    route: str = "extract",
) -> dict[str, Any]:
    """Requests fired at pre-computed times; latency counts from the scheduled time, so a server
    that falls behind shows it in latency instead of silently lowering the offered load."""
    schedule = arrivals(rate, duration, kind, seed)
    batches = itertools.cycle([sentences[i : i + per_request] for i in range(0, len(sentences), per_request)])
    samples: list[Sample] = []
    tasks: set[asyncio.Task[None]] = set()
    overflow = 0
    before = await scrape(client)
    start = time.perf_counter()

    async def fire(due: float, batch: list[list[str]]) -> None:
        samples.append(await extract(client, model, batch, scheduled=due, route=route))

    for offset in schedule:
        due = start + offset
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if len(tasks) >= MAX_OUTSTANDING:
            overflow += 1
            continue
        task = asyncio.create_task(fire(due, next(batches)))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.wait(tasks, timeout=120)
    seconds = max(time.perf_counter() - start, duration)
    after = await scrape(client)
    label = {
        "mode": "open",
        "model": model,
        "route": route,
        "rate": rate,
        "arrivals": kind,
        "sentences_per_request": per_request,
        "offered": len(schedule),
        "client_overflow": overflow,
    }
    return {**summarize_run(samples, seconds, label, duration), **server_split(before, after, model, seconds)}


async def trivial_ceiling(client: aiohttp.ClientSession, concurrency: int, seconds: float) -> float:
    """Requests/s the client gets from `GET /health/live` (no model work): the most the client and
    the server's HTTP front can exchange; a served figure says something of the engine only where
    this is at least twice it."""
    answered = 0
    end = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal answered
        while time.perf_counter() < end:
            async with client.get("/health/live") as response:
                await response.read()
                answered += response.status == 200

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return answered / (time.perf_counter() - started)
