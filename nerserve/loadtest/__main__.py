"""python -m nerserve.loadtest protocol|run ... (see loadtest/__init__.py)."""

from __future__ import annotations

import json
import os
import platform
import time
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

os.environ.setdefault("TYPER_USE_RICH", "0")

import aiohttp
import typer

from nerserve.loadtest.client import (
    ORDER_HELP,
    Order,
    Route,
    arrange,
    has_uvloop,
    make_client,
    model_info,
    model_row,
    read_sentences,
    run_event_loop,
)
from nerserve.loadtest.protocols import protocol_batches, run_protocol
from nerserve.loadtest.report import markdown, slo_throughput, write_outputs
from nerserve.loadtest.runs import closed_loop, open_loop
from nerserve.loadtest.schedule import sweep_rates

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Load tests and paper protocols for nerserve.")
URL = Annotated[str, typer.Option(help="nerserve base URL (loopback only in tests)")]


class Table(StrEnum):
    nag = "nag"
    setgen = "setgen"
    gner = "gner"


class Mode(StrEnum):
    closed = "closed"
    open = "open"


def _meta(url: str, extra: dict[str, Any]) -> dict[str, Any]:
    return {
        "url": url,
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "client_machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "client_cores": sorted(os.sched_getaffinity(0)),
        "client_library": "aiohttp " + aiohttp.__version__ + (" + uvloop" if has_uvloop() else ""),
        **extra,
    }


@app.command()
def protocol(
    table: Annotated[Table, typer.Option(help="which paper's protocol")],
    models: Annotated[
        str,
        typer.Option(help="comma-separated rows: a served model name, or name?option=value&… (e.g. diffusion-conll03?steps=1)"),
    ],
    data: Annotated[Path, typer.Option(help="dataset folder (its test split is used)")],
    url: URL = "http://127.0.0.1:8000",
    reference: Annotated[
        str | None, typer.Option(help="row to compare against, e.g. bartner-conll03 (default: the first model at batch 1)")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
    max_seconds: Annotated[float, typer.Option(min=1.0)] = 120.0,
    api_key: Annotated[
        str | None, typer.Option(envvar="NERSERVE_API_KEY", help="sent as a bearer token (default: $NERSERVE_API_KEY)")
    ] = None,
) -> None:
    """One paper's efficiency table: sentences/s end-to-end and model-only, and speed-up."""
    sentences = read_sentences(data)
    names = [m.strip() for m in models.split(",") if m.strip()]

    async def go() -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        async with make_client(url, 4, api_key) as client:
            batches, repeat = protocol_batches(table.value, sentences)
            for row in names:
                name, options = model_row(row)
                info = await model_info(client, name)
                result = await run_protocol(client, name, batches, repeat, max_seconds, options)
                rows.append(
                    {
                        "model": row,
                        "batching": table.value,
                        "settings": {**info["options"], **options},
                        "runtime": info["runtime"],
                        **result,
                    }
                )
            if reference is None:  # the 1× row: the first model, the same sentences one per request
                singles = [[sentence] for batch in batches for sentence in batch]
                name, options = model_row(names[0])
                info = await model_info(client, name)
                result = await run_protocol(client, name, singles, repeat, max_seconds, options)
                rows.append(
                    {
                        "model": f"{names[0]} (batch 1)",
                        "batching": "1 sentence/request",
                        "settings": info["options"],
                        "runtime": info["runtime"],
                        **result,
                        "reference": True,
                    }
                )
        return rows

    rows = run_event_loop(go())
    base = next((r for r in rows if r.get("reference") or r["model"] == reference), rows[0])
    for row in rows:
        row["speedup"] = row["sentences_per_second"] / base["sentences_per_second"] if base["sentences_per_second"] else 0
    meta = _meta(url, {"table": table.value, "data": str(data), "reference": base["model"]})
    result: dict[str, Any] = {"meta": meta, "rows": rows}
    if as_json:
        typer.echo(json.dumps(result))
        return
    typer.echo(f"{table.value} protocol on {data} ({meta['when']}, client {meta['client_machine']})")
    typer.echo("| model | runtime | settings | sentences/s (end-to-end) | sentences/s (model only) | speed-up |")
    typer.echo("|---|---|---|---:|---:|---:|")
    for r in rows:
        settings = ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in r["settings"].items())
        typer.echo(
            f"| {r['model']} | {r['runtime']} | {settings} | {r['sentences_per_second']:.1f} | "
            f"{r['model_only_sentences_per_second']:.1f} | {r['speedup']:.2f}× |"
        )


@app.command()
def run(
    model: Annotated[str, typer.Option(help="served model name")],
    data: Annotated[Path, typer.Option(help="dataset folder (its test split is used)")],
    mode: Annotated[Mode, typer.Option()] = Mode.closed,
    concurrency: Annotated[str, typer.Option(help="closed loop: comma-separated levels")] = "1,4,16,64",
    rate: Annotated[str, typer.Option(help="open loop: requests/s, or 'sweep'")] = "sweep",
    sweep: Annotated[str, typer.Option(help="sweep as start:stop:steps (requests/s)")] = "10:400:8",
    arrivals: Annotated[str, typer.Option(help="poisson or constant")] = "poisson",
    duration: Annotated[float, typer.Option(min=1.0, help="seconds per level")] = 15.0,
    once: Annotated[
        bool, typer.Option("--once", help="closed loop: send the split once, then stop (--duration caps it)")
    ] = False,
    order: Annotated[Order, typer.Option(help=ORDER_HELP)] = Order.SHUFFLED,
    sentences_per_request: Annotated[int, typer.Option(min=1)] = 1,
    slo_p99_ms: Annotated[float | None, typer.Option(help="report the highest open-loop rate with p99 under it")] = None,
    url: URL = "http://127.0.0.1:8000",
    out: Annotated[Path, typer.Option(help="folder for summary.json, results.csv, table.md, plot")] = Path("loadtest-results"),
    route: Annotated[Route, typer.Option(help="extract: POST /extract; v2: the model's KServe v2 infer route")] = (
        Route.extract
    ),
    connections: Annotated[
        int, typer.Option(min=1, help="keep-alive connections at most (more requests wait in the client)")
    ] = 2000,
    api_key: Annotated[
        str | None, typer.Option(envvar="NERSERVE_API_KEY", help="sent as a bearer token (default: $NERSERVE_API_KEY)")
    ] = None,
) -> None:
    """Closed-loop concurrency sweep or open-loop rate sweep against one model."""
    sentences = arrange(read_sentences(data), order)

    async def go() -> list[dict[str, Any]]:
        runs: list[dict[str, Any]] = []
        async with make_client(url, connections, api_key) as client:
            await model_info(client, model)
            if mode == Mode.closed:
                for level in [int(c) for c in concurrency.split(",")]:
                    length = "the split once" if once else f"{duration:g}s"
                    typer.echo(f"closed loop, concurrency {level}, {length} ...", err=True)
                    runs.append(
                        await closed_loop(client, model, sentences, level, duration, sentences_per_request, once, route.value)
                    )
            else:
                start, stop, steps = sweep.split(":")
                rates = sweep_rates(float(start), float(stop), int(steps)) if rate == "sweep" else [float(rate)]
                for offered in rates:
                    typer.echo(f"open loop, {offered:g} requests/s for {duration:g}s ...", err=True)
                    runs.append(
                        await open_loop(
                            client, model, sentences, offered, duration, arrivals, sentences_per_request, route=route.value
                        )
                    )
        return runs

    runs = run_event_loop(go())
    meta = _meta(
        url,
        {
            "model": model,
            "data": str(data),
            "mode": mode.value,
            "duration": duration,
            "once": once,
            "order": order.value,
            "connections": connections,
        },
    )
    summary = write_outputs(runs, out, meta, f"{model}: {mode.value} loop")
    if slo_p99_ms is not None:
        summary["slo"] = {"p99_ms": slo_p99_ms, "best": slo_throughput(runs, slo_p99_ms)}
        (out / "summary.json").write_text(json.dumps(summary, indent=2))
        best = summary["slo"]["best"]
        typer.echo(
            f"SLO p99 < {slo_p99_ms} ms: "
            + (f"{best['rate']} requests/s, {best['sentences_per_second']:.1f} sentences/s" if best else "no rate met it")
        )
    typer.echo(markdown(runs))
    typer.echo(f"written to {out}/ (summary.json, results.csv, table.md, throughput_latency.png; overload.png for a sweep)")


app()
