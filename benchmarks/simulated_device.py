"""How busy the engine keeps a GPU it does not have: a server started with `--device simulated`
(stand-in graphs that wait a measured card's batch costs, zeros for outputs) driven in a closed loop,
one sentence a request (or `--per-request N`), at each concurrency; its device's busy seconds are
read from `/info` before and after each level. Every figure is simulated: it measures the engine and the HTTP front around a
device of that speed, never the device.

    taskset -c 0 nerserve serve --models span-conll03 --device simulated --threads 1 --port 8041 &
    taskset -c 1 python benchmarks/simulated_device.py --url http://127.0.0.1:8041 \
        --data ../shared/data/conll03 --concurrency 1,16,64,256 --out docs/reference-run/simulated-device.json

With `--http-workers W` on the server, pass `--workers W --server-pid PID` (the server's process):
each level then reports the CPU milliseconds per answered request of the engine and each worker.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
from pathlib import Path
from typing import Annotated, Any

import typer

from nerserve.loadtest.client import ORDER_HELP, Order, Route, arrange, make_client, read_sentences
from nerserve.loadtest.runs import closed_loop, trivial_ceiling

app = typer.Typer(add_completion=False)


async def _info(client: Any) -> dict[str, Any]:
    async with client.get("/info") as response:
        body: dict[str, Any] = await response.json()
    if body.get("device") != "simulated":
        raise SystemExit(f"the server runs on {body.get('device')!r}: start it with --device simulated")
    return body


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of one process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def server_processes(pid: int) -> dict[str, int]:
    """The server's engine process (PID) and its HTTP worker children, by role."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    workers = [int(c) for c in children if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()]
    return {"engine": pid, **{f"http-{i}": worker for i, worker in enumerate(sorted(workers))}}


def cpu_per_request(before: dict[str, float], after: dict[str, float], requests: int) -> dict[str, float]:
    """CPU milliseconds each process spent per answered request over a level (a worker's own share
    of every request), and the workers' together: what a request costs the HTTP front."""
    spent = {role: 1000 * (after[role] - before[role]) / max(requests, 1) for role in before}
    workers = sum(ms for role, ms in spent.items() if role.startswith("http-"))
    return {**{role: round(ms, 3) for role, ms in spent.items()}, "workers": round(workers, 3)}


async def measure(
    url: str,
    model: str,
    sentences: list[list[str]],
    levels: list[int],
    duration: float,
    workers: int,
    pid: int | None,
    per_request: int = 1,
    route: str = "extract",
) -> dict[str, Any]:
    rows = []
    processes = server_processes(pid) if pid is not None else {}
    async with make_client(url, max(levels) * 2) as client:
        device = (await _info(client))["simulated_device"]
        for concurrency in levels:
            before = (await _info(client))["simulated_device"]
            cpu_before = {role: cpu_seconds(p) for role, p in processes.items()}
            run = await closed_loop(client, model, sentences, concurrency, duration, per_request=per_request, route=route)
            cpu_after = {role: cpu_seconds(p) for role, p in processes.items()}
            after = (await _info(client))["simulated_device"]
            busy = after["busy_seconds"] - before["busy_seconds"]
            passes = after["passes"] - before["passes"]
            rows.append(
                {
                    "concurrency": concurrency,
                    "sentences_per_second": round(run["sentences_per_second"], 1),
                    "requests_per_second_per_worker": round(run["ok"] / run["seconds"] / workers, 1),
                    "device_busy": round(busy / run["seconds"], 4),
                    "device_passes_per_second": round(passes / run["seconds"], 1),
                    "sentences_per_pass": round(run["sentences_per_second"] * run["seconds"] / passes, 1) if passes else None,
                    "latency_ms": {k: run["latency_ms"][k] for k in ("p50", "p99") if k in run["latency_ms"]},
                    "refused": run["http_429"],
                    "errors": run["errors"] - run["http_429"],
                    **({"cpu_ms_per_request": cpu_per_request(cpu_before, cpu_after, run["ok"])} if processes else {}),
                }
            )
            print(json.dumps(rows[-1]), flush=True)
        ceiling = await trivial_ceiling(client, max(levels), min(duration, 10.0))
        print(json.dumps({"trivial_endpoint_requests_per_second": round(ceiling, 1)}), flush=True)
    return {
        "simulated": True,
        "device": {k: device[k] for k in ("card", "source")},
        "model": model,
        "route": route,
        "http_workers": workers,
        "sentences_per_request": per_request,
        "seconds_per_level": duration,
        "client_machine": platform.processor() or platform.machine(),
        "levels": rows,
        "trivial_endpoint_requests_per_second": round(ceiling, 1),
    }


@app.command()
def main(
    data: Annotated[Path, typer.Option(help="dataset folder (its test split is sent)")],
    url: Annotated[str, typer.Option()] = "http://127.0.0.1:8041",
    model: Annotated[str, typer.Option()] = "span-conll03",
    concurrency: Annotated[str, typer.Option(help="comma-separated levels")] = "1,16,64,256",
    duration: Annotated[float, typer.Option(min=1.0, help="seconds per level")] = 20.0,
    workers: Annotated[int, typer.Option(min=1, help="HTTP worker processes the server runs")] = 1,
    server_pid: Annotated[
        int | None, typer.Option(help="the server's process id: CPU time per request of the engine and each worker")
    ] = None,
    per_request: Annotated[int, typer.Option(min=1, help="sentences in each request")] = 1,
    order: Annotated[Order, typer.Option(help=ORDER_HELP)] = Order.SHUFFLED,
    route: Annotated[Route, typer.Option(help="extract: POST /extract, pre-tokenised; v2: the model's KServe v2 infer")] = (
        Route.extract
    ),
    out: Annotated[Path | None, typer.Option(help="JSON file to write")] = None,
) -> None:
    levels = [int(level) for level in concurrency.split(",")]
    sentences = arrange(read_sentences(data), order)
    report = asyncio.run(measure(url, model, sentences, levels, duration, workers, server_pid, per_request, route.value))
    report["order"] = order.value
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    app()
