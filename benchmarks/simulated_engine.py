"""How busy the engine alone keeps a simulated device: the engine process's own part of serving
(admission, the fair queue, batching, prepare, the device pass, decode) driven in a closed loop
from inside its process, without an HTTP front. Requests arrive as an HTTP worker sends them to the
engine (planned: sub-word units, `LocalEngine.start_planned`), one sentence each (or `--per-request N`),
from CONCURRENCY coroutines; the device's busy seconds are read before and after each level.

This separates the two costs `simulated_device.py` measures together: what the engine needs per
request to keep a card busy, and what the HTTP front adds (that benchmark's requests/s per worker
process). Every figure is simulated: the stand-in graphs wait a measured card's batch costs and
answer zeros; it measures the engine around a device of that speed, never the device.

    taskset -c 0 python benchmarks/simulated_engine.py --data ../shared/data/conll03 \
        --concurrency 1,16,64,256 --out docs/reference-run/simulated-engine.json
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import platform
import resource
import threading
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from nerserve.compose import START_UP_EXPORTER
from nerserve.loadtest.client import ORDER_HELP, Order, arrange, read_sentences
from nerserve.loadtest.stats import percentile
from nerserve.service.api.extraction import PlannedQuery, UnitAnswers
from nerserve.service.config import Settings
from nerserve.service.engine import LocalEngine
from nerserve.service.interpreter import hand_over_quickly
from nerserve.service.main import create_app

app = typer.Typer(add_completion=False)


def cpu_seconds() -> float:
    """This process's user + system CPU time so far (every thread)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def thread_cpu_seconds() -> dict[str, float]:
    """CPU seconds so far by thread role, read from /proc (Linux; empty elsewhere): the event loop
    (the main thread) and the batcher's prepare, graphs and decode threads (by their name's prefix)."""
    roles = {thread.native_id: thread.name.split("_")[0] for thread in threading.enumerate()}
    ticks = os.sysconf("SC_CLK_TCK")
    seconds: dict[str, float] = {}
    for tid, role in roles.items():
        try:
            fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        role = "loop" if role == "MainThread" else role
        seconds[role] = seconds.get(role, 0.0) + (int(fields[11]) + int(fields[12])) / ticks
    return seconds


async def closed_loop(
    engine: LocalEngine, model: str, queries: list[PlannedQuery], concurrency: int, seconds: float
) -> tuple[int, list[float]]:
    """CONCURRENCY callers, each sending its next query as soon as the last is answered, for
    SECONDS: requests answered and their latencies. Each query starts as the engine link starts a
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
    return len(latencies), latencies


async def measure(
    model: str, sentences: list[list[str]], levels: list[int], seconds: float, per_request: int, costs: Path | None
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
        rows = []
        for concurrency in levels:
            before, cpu_before, threads_before = await engine.device_report(), cpu_seconds(), thread_cpu_seconds()
            started = time.perf_counter()
            answered, latencies = await closed_loop(engine, model, queries, concurrency, seconds)
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
            print(json.dumps(rows[-1]), flush=True)
    return {"model": model, "per_request": per_request, "seconds": seconds, "device": device, "rows": rows}


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
    out: Path | None = None,
) -> None:
    levels = [int(level) for level in concurrency.split(",")]
    hand_over_quickly()  # as the server's processes run
    result = asyncio.run(measure(model, arrange(read_sentences(data), order), levels, seconds, per_request, costs))
    result |= {
        "simulated": True,
        "order": order.value,
        "what": "the engine alone (no HTTP front), driven in its own process; the device waits the card's batch costs",
        "machine": {"cpu": platform.processor() or platform.machine(), "cores_allowed": len(os.sched_getaffinity(0))},
        "date": time.strftime("%Y-%m-%d"),
    }
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["rows"], indent=1))


if __name__ == "__main__":
    app()
