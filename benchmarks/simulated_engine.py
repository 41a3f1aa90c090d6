"""How busy the engine alone keeps a simulated device: the engine process's own part of serving
(admission, the fair queue, batching, prepare, the device pass, decode) driven in a closed loop
from inside its process, without an HTTP front. Requests arrive as an HTTP worker sends them to the
engine (planned: sub-word units, `LocalEngine.start_planned`), one sentence each (or `--per-request N`),
from CONCURRENCY coroutines; the device's busy seconds are read before and after each level.

This separates the two costs `simulated_device.py` measures together: what the engine needs per
request to keep a card busy, and what the HTTP front adds (that benchmark's requests/s per worker
process). Every figure is simulated: the stand-in graphs wait a measured card's batch costs and
answer zeros; it measures the engine around a device of that speed, never the device.

With `--link-clients K` the requests come instead through the engine link itself, from K processes
that speak it as HTTP workers do (a planned request's run, its reply, the response's record) but
do no HTTP and no planning: what the engine process costs a request, its link included, where
workers on cores of their own keep up (a GPU node). `--link-client-cores` pins those processes;
each row then says how busy they kept their cores.

With `--replay-turns N` each level is instead N turns of one frame of CONCURRENCY requests, sent
through the link from this process once the last frame is answered in full: the engine's CPU a
request (its loop, with its reading of this process's replies taken out, and each thread's), as a
worker's turn costs it, free of a closed loop's timing. Two trees compare side by side, one core
each, each run's cores swapped the next time.

    taskset -c 0 python benchmarks/simulated_engine.py --data ../shared/data/conll03 \
        --concurrency 1,16,64,256 --out docs/reference-run/simulated-engine.json
    taskset -c 0 python benchmarks/simulated_engine.py --data ../shared/data/conll03 \
        --concurrency 16,64,256 --link-clients 2 --link-client-cores 1 --out RUN.json
    taskset -c 0 python benchmarks/simulated_engine.py --data ../shared/data/conll03 \
        --concurrency 128 --replay-turns 300 --out RUN.json
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import json
import multiprocessing
import os
import platform
import resource
import shutil
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Annotated, Any

import typer

from nerserve.compose import START_UP_EXPORTER
from nerserve.loadtest.client import ORDER_HELP, Order, arrange, read_sentences, run_event_loop
from nerserve.loadtest.stats import percentile
from nerserve.service.api.extraction import PlannedQuery, UnitAnswers
from nerserve.service.config import Settings
from nerserve.service.engine import LocalEngine
from nerserve.service.engine_link import EngineServer, FrameReader, FrameWriter, PerTurn, frame
from nerserve.service.interpreter import hand_over_quickly
from nerserve.service.main import create_app
from nerserve.service.metrics import ResponseRecord, thread_cpu_seconds
from nerserve.service.server import engine_loop_factory

app = typer.Typer(add_completion=False)


def cpu_seconds() -> float:
    """This process's user + system CPU time so far (every thread)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def closed_loop(
    engine: LocalEngine, model: str, queries: list[PlannedQuery], concurrency: int, seconds: float
) -> list[float]:
    """CONCURRENCY callers, each sending its next query as soon as the last is answered, for
    SECONDS: the answered requests' latencies. Each query starts as the engine link starts a
    worker's (`LocalEngine.start_planned`, its answer a callback) and the next is sent on the
    loop's next turn, as a worker's next message would arrive."""
    loop = asyncio.get_running_loop()
    stop_at = time.perf_counter() + seconds
    latencies: list[float] = []
    callers_left = concurrency
    finished: asyncio.Future[None] = loop.create_future()

    def send(index: int) -> None:
        nonlocal callers_left
        if time.perf_counter() >= stop_at:
            callers_left -= 1
            if callers_left == 0:
                finished.set_result(None)
            return
        sent = time.perf_counter()

        def answered(outcome: UnitAnswers | BaseException) -> None:
            if isinstance(outcome, BaseException):
                fail(outcome)
                return
            latencies.append(time.perf_counter() - sent)
            loop.call_soon(send, index + concurrency)

        try:
            engine.start_planned(model, queries[index % len(queries)], "", answered, admitted=False)
        except Exception as error:  # a refusal: the benchmark is over the engine's bound, and says so
            fail(error)

    def fail(error: BaseException) -> None:
        if not finished.done():
            finished.set_exception(error)

    for caller in range(concurrency):
        send(caller)
    await finished
    return latencies


async def in_process(
    engine: LocalEngine, model: str, queries: list[PlannedQuery], concurrency: int, seconds: float
) -> tuple[list[float], float | None]:
    """`closed_loop` as a Level: its callers are this process's own."""
    return await closed_loop(engine, model, queries, concurrency, seconds), None


# (concurrency, seconds) → the answered requests' latencies, and the CPU seconds the link's client
# processes spent (None without them)
Level = Callable[[int, float], Awaitable[tuple[list[float], float | None]]]


async def measure(
    model: str,
    sentences: list[list[str]],
    levels: list[int],
    seconds: float,
    per_request: int,
    costs: Path | None,
    link_clients: int = 0,
    link_client_cores: set[int] | None = None,
    replay_turns: int = 0,
) -> dict[str, Any]:
    # configured as for HTTP worker processes (a turn's answers in one message), which it stands in for
    settings = Settings(models=[model], device="simulated", threads=1, simulated_device_costs=costs, http_workers=2)
    service = create_app(settings, START_UP_EXPORTER)  # graphs exported first where missing
    async with service.router.lifespan_context(service):
        state = service.state.service
        engine = state.engine
        assert isinstance(engine, LocalEngine)
        while state.model_states.get(model) != "ready":
            if state.model_states.get(model) == "failed":
                raise SystemExit(f"{model}: {state.model_errors.get(model)}")
            await asyncio.sleep(0.1)
        planner = state.models[model].planner
        queries = []
        for first in range(0, len(sentences) - per_request + 1, per_request):
            planned = planner.plan(tokens=sentences[first : first + per_request])
            units = [(unit.sentence, unit.cost) for text in planned for unit in text.units]
            queries.append(PlannedQuery(units, None, {}, None, "tokens"))
        gc.freeze()  # the benchmark's own sentences: not the engine's to collect over and over
        await closed_loop(engine, model, queries, 16, 2.0)  # warm-up: caches, the batcher's rates
        report = await engine.device_report()
        assert report is not None  # the settings ask for the simulated device
        device = {key: report[key] for key in ("card", "source")}
        if replay_turns:
            rows = [await replayed_turns(engine, model, queries, level, replay_turns) for level in levels]
        else:
            async with link_fed(engine, model, queries, link_clients, link_client_cores) as through_link:
                level: Level = through_link or (lambda concurrency, span: in_process(engine, model, queries, concurrency, span))
                rows = await run_levels(engine, level, levels, seconds, per_request)
    return {"model": model, "per_request": per_request, "seconds": seconds, "device": device, "rows": rows}


async def replayed_turns(
    engine: LocalEngine, model: str, queries: list[PlannedQuery], per_turn: int, turns: int
) -> dict[str, Any]:
    """TURNS frames of PER_TURN requests through the engine's link, each sent once the last is
    answered in full: the engine's CPU a request, by thread, its loop's with this process's own
    reading of the replies taken out (the median turn's, and over all turns)."""
    folder = tempfile.mkdtemp(prefix="simulated-engine-")
    path = os.path.join(folder, "engine.sock")
    server = EngineServer(engine)
    await server.start(path)
    try:
        reader, writer = await asyncio.open_unix_connection(path)
        replies, ids = TimedReplies(reader), itertools.count(1)
        await replies.read_replies(1)  # the engine's state, pushed on connection
        loop_seconds: list[float] = []
        threads_before, passes_before = thread_cpu_seconds(), await passes_so_far(engine)
        for turn in range(turns):
            sent = [queries[(turn * per_turn + index) % len(queries)] for index in range(per_turn)]
            data = frame([("run_planned", next(ids), (model, query, "", False)) for query in sent])
            started, replies.seconds = time.thread_time(), 0.0
            writer.write(data)
            await replies.read_replies(per_turn)
            loop_seconds.append(time.thread_time() - started - replies.seconds)
        threads_after, passes = thread_cpu_seconds(), await passes_so_far(engine) - passes_before
        writer.close()
    finally:
        await server.close()
        shutil.rmtree(folder, ignore_errors=True)
    requests = turns * per_turn
    row = {
        "requests_a_turn": per_turn,
        "turns": turns,
        "sentences_per_pass": round(requests * len(queries[0].units) / max(passes, 1), 1),
        "loop_us_per_request": round(1e6 * statistics.median(loop_seconds) / per_turn, 2),
        "loop_us_per_request_all_turns": round(1e6 * sum(loop_seconds) / requests, 2),
        # the other threads from /proc, over all turns (its clock ticks are too coarse for one)
        "thread_us_per_request": {
            role: round(1e6 * (spent - threads_before.get(role, 0.0)) / requests, 2)
            for role, spent in sorted(threads_after.items())
            if role != "loop"
        },
    }
    print(json.dumps(row), flush=True)
    return row


async def run_levels(
    engine: LocalEngine, level: Level, levels: list[int], seconds: float, per_request: int
) -> list[dict[str, Any]]:
    """Each level's row: sentences/s, the device's busy share, latency, the engine's CPU a request."""
    rows = []
    for concurrency in levels:
        before, cpu_before, threads_before = await engine.device_report(), cpu_seconds(), thread_cpu_seconds()
        started = time.perf_counter()
        latencies, client_cpu = await level(concurrency, seconds)
        answered = len(latencies)
        elapsed = time.perf_counter() - started
        after, cpu_after, threads_after = await engine.device_report(), cpu_seconds(), thread_cpu_seconds()
        assert before is not None and after is not None
        passes = after["passes"] - before["passes"]
        rows.append(
            {
                "concurrency": concurrency,
                "requests_per_second": round(answered / elapsed, 1),
                "sentences_per_second": round(answered * per_request / elapsed, 1),
                "device_busy": round((after["busy_seconds"] - before["busy_seconds"]) / elapsed, 4),
                "sentences_per_pass": round(answered * per_request / max(passes, 1), 1),
                "p50_ms": round(1000 * percentile(latencies, 50), 2),
                "p99_ms": round(1000 * percentile(latencies, 99), 2),
                "cpu_ms_per_request": round(1000 * (cpu_after - cpu_before) / max(answered, 1), 4),
                # where it went: the loop (admission, queue, answers, this benchmark's callers)
                # and the prepare, graphs and decode threads
                "cpu_ms_per_request_by_thread": {
                    role: round(1000 * (spent - threads_before.get(role, 0.0)) / max(answered, 1), 4)
                    for role, spent in sorted(threads_after.items())
                },
            }
        )
        if client_cpu is not None:  # the link's client processes: whether their cores kept up
            rows[-1]["link_clients_cpu_ms_per_request"] = round(1000 * client_cpu / max(answered, 1), 4)
            rows[-1]["link_clients_cores_busy"] = round(client_cpu / elapsed, 3)
        print(json.dumps(rows[-1]), flush=True)
    return rows


async def passes_so_far(engine: LocalEngine) -> int:
    report = await engine.device_report()
    assert report is not None  # the settings ask for the simulated device
    return int(report["passes"])


class TimedReplies(FrameReader):
    """The engine's messages to a replayed turn, read off its link, and the CPU seconds unpickling
    them took this thread (taken out of the engine's loop: the two share it)."""

    seconds = 0.0

    def complete(self) -> list[Any]:
        started = time.thread_time()
        messages = super().complete()
        self.seconds += time.thread_time() - started
        return messages

    async def read_replies(self, count: int) -> None:
        """Until COUNT messages have come; a refusal ends the benchmark, as over the engine's bound."""
        while count > 0:
            for message in await self.read():
                if message[0] == "reply" and not message[2]:
                    raise SystemExit(f"the engine refused a request: {message[3]}")
                count -= 1


@contextlib.asynccontextmanager
async def link_fed(
    engine: LocalEngine, model: str, queries: list[PlannedQuery], clients: int, cores: set[int] | None
) -> AsyncIterator[Level | None]:
    """With CLIENTS > 0: the engine served on its link, and CLIENTS processes that send it the
    QUERIES as HTTP workers do, started and connected; yields the level runner that drives them
    (None with no clients: the callers are then this process's own)."""
    if not clients:
        yield None
        return
    folder = tempfile.mkdtemp(prefix="simulated-engine-")
    path = os.path.join(folder, "engine.sock")
    server = EngineServer(engine)
    await server.start(path)
    spawn = multiprocessing.get_context("spawn")
    orders = [spawn.Pipe() for _ in range(clients)]
    processes = [
        spawn.Process(target=link_client, args=(path, model, queries, index, clients, cores, child), daemon=True)
        for index, (_, child) in enumerate(orders)
    ]
    loop = asyncio.get_running_loop()
    try:
        for process in processes:
            process.start()
        for own, _ in orders:  # each says it is connected
            await loop.run_in_executor(None, own.recv)

        async def level(concurrency: int, seconds: float) -> tuple[list[float], float | None]:
            for own, _ in orders:
                own.send((concurrency, seconds))
            results = await asyncio.gather(*(loop.run_in_executor(None, own.recv) for own, _ in orders))
            refused = sum(count for _, count, _ in results)
            if refused:  # the benchmark is over the engine's bound, and says so
                raise SystemExit(f"c = {concurrency}: the engine refused {refused} requests")
            latencies = [latency for answered, _, _ in results for latency in answered]
            return latencies, sum(spent for _, _, spent in results)

        yield level
    finally:
        for own, _ in orders:
            own.send(None)
        for process in processes:
            process.join(timeout=10)
        await server.close()
        shutil.rmtree(folder, ignore_errors=True)


def link_client(
    path: str, model: str, queries: list[PlannedQuery], index: int, clients: int, cores: set[int] | None, orders: Connection
) -> None:
    """A process that stands in for an HTTP worker: on each order (concurrency, seconds) its share
    of the callers (every CLIENTS-th from INDEX) run a closed loop through the engine link; it
    answers with their latencies, the requests refused and the CPU seconds it spent."""
    if cores:
        os.sched_setaffinity(0, cores)
    hand_over_quickly()
    run_event_loop(_link_client(path, model, queries, index, clients, orders))  # uvloop, as the workers run


async def _link_client(
    path: str, model: str, queries: list[PlannedQuery], index: int, clients: int, orders: Connection
) -> None:
    reader, writer = await asyncio.open_unix_connection(path)
    incoming = FrameReader(reader)
    link = LinkCalls(FrameWriter(writer), model, queries)

    async def read_replies() -> None:
        while True:
            for message in await incoming.read():
                if message[0] == "reply":  # else the engine's state, pushed
                    link.pending.pop(message[1]).set_result(message[2])

    replies = asyncio.create_task(read_replies())
    loop = asyncio.get_running_loop()
    orders.send("connected")
    while (order := await loop.run_in_executor(None, orders.recv)) is not None:
        concurrency, seconds = order
        stop_at, cpu_before = time.perf_counter() + seconds, cpu_seconds()
        await asyncio.gather(*(link.caller(first, concurrency, stop_at) for first in range(index, concurrency, clients)))
        orders.send((link.latencies, link.refused, cpu_seconds() - cpu_before))
        link.latencies, link.refused = [], 0
    replies.cancel()
    writer.close()


@dataclass
class LinkCalls:
    """A stand-in worker's calls on the engine link, and what they met."""

    out: FrameWriter
    model: str
    queries: list[PlannedQuery]
    pending: dict[int, asyncio.Future[bool]] = field(default_factory=dict)
    ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    latencies: list[float] = field(default_factory=list)
    refused: int = 0
    records: PerTurn[ResponseRecord] = field(init=False)

    def __post_init__(self) -> None:
        self.records = PerTurn(lambda records: self.out.send(("records", None, (records,))))

    async def caller(self, query: int, concurrency: int, stop_at: float) -> None:
        """Queries QUERY, QUERY + CONCURRENCY, … each sent once the last is answered, until STOP_AT;
        each response recorded as a worker records it."""
        loop = asyncio.get_running_loop()
        while time.perf_counter() < stop_at:
            sent = time.perf_counter()
            call_id = next(self.ids)
            reply = self.pending[call_id] = loop.create_future()
            self.out.send(("run_planned", call_id, (self.model, self.queries[query % len(self.queries)], "", False)))
            ok = await reply
            latency = time.perf_counter() - sent
            if ok:
                self.latencies.append(latency)
            else:
                self.refused += 1
            self.records.add((self.model, 200 if ok else 429, None, latency))
            query += concurrency


@app.command()
def main(
    data: Annotated[Path, typer.Option(help="a canonical dataset folder; its test split's sentences are sent")],
    model: str = "span-conll03",
    concurrency: str = "1,16,64,256",
    seconds: float = 15.0,
    per_request: Annotated[int, typer.Option(min=1)] = 1,
    costs: Annotated[
        Path | None, typer.Option(help="batch costs: a file or a bundled table's name (default: the bare encoder on an H100)")
    ] = None,
    order: Annotated[Order, typer.Option(help=ORDER_HELP)] = Order.SHUFFLED,
    link_clients: Annotated[
        int, typer.Option(min=0, help="processes sending the requests through the engine link as HTTP workers do (0: none)")
    ] = 0,
    link_client_cores: Annotated[str | None, typer.Option(help="the cores those processes may use, comma-separated")] = None,
    replay_turns: Annotated[
        int, typer.Option(min=0, help="instead of a closed loop, this many turns of CONCURRENCY requests each through the link")
    ] = 0,
    out: Path | None = None,
) -> None:
    levels = [int(level) for level in concurrency.split(",")]
    cores = {int(core) for core in link_client_cores.split(",")} if link_client_cores else None
    hand_over_quickly()  # as the server's processes run
    sentences = arrange(read_sentences(data), order)
    # on the engine process's own event loop (libuv's where installed), as `nerserve serve` runs it
    with asyncio.Runner(loop_factory=engine_loop_factory()) as runner:
        result = runner.run(measure(model, sentences, levels, seconds, per_request, costs, link_clients, cores, replay_turns))
    result |= {
        "simulated": True,
        "order": order.value,
        "what": "the engine alone (no HTTP front), driven "
        + (
            f"through its link by turns replayed from its own process ({replay_turns} a level)"
            if replay_turns
            else f"through its link by {link_clients} processes"
            if link_clients
            else "in its own process"
        )
        + "; the device waits the card's batch costs",
        "machine": {"cpu": platform.processor() or platform.machine(), "cores_allowed": len(os.sched_getaffinity(0))},
        "date": time.strftime("%Y-%m-%d"),
    }
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["rows"], indent=1))


if __name__ == "__main__":
    app()
