"""A served model's closed-loop figures, with a load client that cannot be the bottleneck unnoticed:
the client runs in several processes, each pinned to its own core, and reports its own ceiling
(requests/s against the server's trivial `GET /health/live`). A served figure says something of the
service only where that ceiling is at least twice it (`client_bound` says when it is not).

    python benchmarks/served_check.py --url http://127.0.0.1:8013 --model span-conll03 \
        --data ../shared/data/conll03 --levels 1,16,64,256 --per-request 1 --processes 4 --cores 12-15
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import time
import urllib.request
from pathlib import Path
from typing import Annotated, Any

import typer

from nerserve.loadtest.client import (
    ORDER_HELP,
    Order,
    arrange,
    growth_by_label,
    make_client,
    read_sentences,
    scrape,
    server_split,
)
from nerserve.loadtest.runs import closed_loop, trivial_ceiling
from nerserve.loadtest.stats import summarize

BATCHES_CLOSED = "nerserve_batches_closed_total"

app = typer.Typer(add_completion=False)


def _split(total: int, parts: int) -> list[int]:
    """`total` clients over at most `parts` processes, as evenly as they go."""
    parts = max(1, min(parts, total))
    return [total // parts + (i < total % parts) for i in range(parts)]


def _pin(cores: list[int], index: int) -> None:
    if cores and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {cores[index % len(cores)]})


async def _extract_loop(
    url: str, model: str, sentences: list[list[str]], clients: int, per_request: int, seconds: float
) -> dict[str, Any]:
    async with make_client(url, clients * 2) as client:
        run = await closed_loop(client, model, sentences, clients, seconds, per_request)
    ok = [s for s in run["samples"] if s[2] == 200]
    return {
        "seconds": run["seconds"],
        "sentences": run["sentences_per_second"] * run["seconds"],
        "latencies": [s[1] for s in ok],
        "refused": run["http_429"],
        "errors": run["errors"] - run["http_429"],
    }


async def _trivial_loop(url: str, clients: int, seconds: float) -> float:
    async with make_client(url, clients * 2) as client:
        return await trivial_ceiling(client, clients, seconds)


def _child(job: tuple[str, dict[str, Any], list[int], int]) -> Any:
    kind, arguments, cores, index = job
    _pin(cores, index)
    if kind == "trivial":
        return asyncio.run(_trivial_loop(**arguments))
    return asyncio.run(_extract_loop(**arguments))


def _in_processes(kind: str, arguments: list[dict[str, Any]], cores: list[int]) -> list[Any]:
    with multiprocessing.get_context("spawn").Pool(len(arguments)) as pool:
        return pool.map(_child, [(kind, a, cores, i) for i, a in enumerate(arguments)])


async def _metrics(url: str) -> dict[str, float]:
    async with make_client(url, 2) as client:
        return await scrape(client)


def level(
    url: str,
    model: str,
    sentences: list[list[str]],
    clients: int,
    per_request: int,
    seconds: float,
    processes: int,
    cores: list[int],
) -> dict[str, Any]:
    shares = _split(clients, processes)
    offset = len(sentences) // len(shares)
    jobs = [
        {
            "url": url,
            "model": model,
            "sentences": sentences[i * offset :] + sentences[: i * offset],  # each process its own order
            "clients": share,
            "per_request": per_request,
            "seconds": seconds,
        }
        for i, share in enumerate(shares)
    ]
    before = asyncio.run(_metrics(url))
    began = time.monotonic()
    results = _in_processes("extract", jobs, cores)
    ended = time.monotonic()
    after = asyncio.run(_metrics(url))
    wall = max(r["seconds"] for r in results)
    latencies = [latency for r in results for latency in r["latencies"]]
    server = server_split(before, after, model, wall)
    return {
        "concurrency": clients,
        "sentences_per_request": per_request,
        # on the machine's monotonic clock, as a server's --batch-log writes its batches: the level's own
        "monotonic_seconds": {"began": round(began, 6), "ended": round(ended, 6)},
        "client_processes": len(shares),
        "sentences_per_second": round(sum(r["sentences"] for r in results) / wall, 1),
        "requests_per_second": round(len(latencies) / wall, 1),
        "latency_ms": {k: round(v, 2) for k, v in summarize(latencies).items()},
        "refused": sum(r["refused"] for r in results),
        "errors": sum(r["errors"] for r in results),
        "server_batch_size_mean": round(server["server_batch_size_mean"], 1),
        "server_queue_ms_mean": round(server["server_queue_ms_mean"], 2),
        "server_batch_inference_ms_mean": round(server["server_batch_inference_ms_mean"], 2),
        "server_graph_busy_fraction": round(server["server_graph_busy_fraction"], 3),
        # the engine process's (the whole server's with one process): what one request costs the
        # process that owns the device, and how many of its cores it kept busy
        "server_process_cpu_ms_per_request": round(1000 * server["server_process_cpu_seconds"] / max(len(latencies), 1), 4),
        "server_process_cores_busy": round(server["server_process_cores_busy"], 3),
        # which of that process's threads spent it: the event loop, prepare, graphs (the lanes), decode
        "server_thread_cpu_ms_per_request": {
            role: round(1000 * spent / max(len(latencies), 1), 4)
            for role, spent in sorted(growth_by_label(before, after, "nerserve_thread_cpu_seconds_total", "role").items())
        },
        # why the batches of the level closed (full, idle, company, clients_back, waited, halves): how the
        # batcher split the clients into batches
        "server_batches_closed": {
            reason: round(count)
            for reason, count in sorted(growth_by_label(before, after, BATCHES_CLOSED, "reason", model).items())
        },
    }


def client_ceiling(url: str, clients: int, seconds: float, processes: int, cores: list[int]) -> float:
    shares = _split(clients, processes)
    rates: list[Any] = _in_processes("trivial", [{"url": url, "clients": s, "seconds": seconds} for s in shares], cores)
    return float(sum(rates))


def served_as(url: str, model: str) -> dict[str, Any] | None:
    """How the server runs MODEL, from its `GET /models` entry (runtime, each graph's execution
    provider: the device, precision, CUDA graphs), so that a figure names what it measured."""
    try:  # asked after the levels: a server gone by then costs this field, not the figures
        with urllib.request.urlopen(f"{url}/models", timeout=10) as response:
            listed = json.load(response)["models"]
    except (OSError, ValueError, KeyError):
        return None
    entry = next((m for m in listed if m.get("name") == model), None)
    return None if entry is None else {key: entry.get(key) for key in ("runtime", "execution_providers", "warm_up")}


def _cores(spec: str) -> list[int]:
    if not spec:
        return []
    if "-" in spec:
        first, last = spec.split("-")
        return list(range(int(first), int(last) + 1))
    return [int(c) for c in spec.split(",")]


@app.command()
def main(
    data: Annotated[Path, typer.Option(help="dataset folder (its test split is sent)")],
    url: Annotated[str, typer.Option()] = "http://127.0.0.1:8013",
    model: Annotated[str, typer.Option()] = "span-conll03",
    levels: Annotated[str, typer.Option(help="comma-separated concurrencies")] = "1,16,64,256",
    per_request: Annotated[int, typer.Option(min=1, help="sentences per request")] = 1,
    duration: Annotated[float, typer.Option(min=1.0, help="seconds per level")] = 8.0,
    processes: Annotated[int, typer.Option(min=1, help="client processes")] = 4,
    cores: Annotated[str, typer.Option(help="cores for the client processes: 12-15 or 12,13 (default: any)")] = "",
    order: Annotated[Order, typer.Option(help=ORDER_HELP)] = Order.SHUFFLED,
    out: Annotated[Path | None, typer.Option(help="JSON file to write")] = None,
    ceiling: Annotated[
        bool, typer.Option(help="measure the client's ceiling after the levels (without it, no figure here counts as a bar's)")
    ] = True,
) -> None:
    sentences = arrange(read_sentences(data), order)
    pinned = _cores(cores)
    rows = []
    for clients in (int(c) for c in levels.split(",")):
        rows.append(level(url, model, sentences, clients, per_request, duration, processes, pinned))
        typer.echo(json.dumps(rows[-1]), err=True)
    limit = client_ceiling(url, max(r["concurrency"] for r in rows), min(duration, 5.0), processes, pinned) if ceiling else None
    for row in rows:
        row["client_bound"] = None if limit is None else limit < 2 * row["requests_per_second"]
    report = {
        "model": model,
        "url": url,
        "order": order.value,
        "client_ceiling_requests_per_second": None if limit is None else round(limit, 1),
        "served_as": served_as(url, model),
        "levels": rows,
    }
    typer.echo(json.dumps(report))
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    app()
