"""Tenants under load, against a server started with two API keys: team-a (no ceiling) and team-b
(a ceiling of CEILING sentences a second), span-conll03 on core 0 with one graph thread, and its
HTTP front in two worker processes (on the same core; drop `--http-workers` for one process):

    NERSERVE_API_KEYS='{"team-a": "<key a>", "team-b": {"key": "<key b>", "max_sentences_per_second": 20}}' \\
      taskset -c 0 nerserve serve --models span-conll03 --threads 1 --port 8047 --http-workers 2 &
    taskset -c 1 python benchmarks/tenants.py --url http://127.0.0.1:8047 --key-a <key a> --key-b <key b>

1. the door at capacity: team-a keeps the server at capacity (closed loop, 32 connections) while
   requests without a key and with a wrong one arrive (open loop, 50/s each, sent from a process of
   their own): their 401s' p99 (bar ≤ 5 ms), and that /metrics counted every one of them;
2. fair share by key: team-a sends one request of 200,000 words; team-b one sentence every 0.5 s
   for 5 s (bar: all 200, each within 1 s);
3. the ceiling: team-b offers twice its ceiling in one-sentence requests while team-a offers the
   same rate: team-b is refused above its ceiling, team-a is not.
"""

from __future__ import annotations

import asyncio
import json
import math
import multiprocessing
import socket
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit

import typer
from fair_share import measure as fair_share  # beside this script

from nerserve.loadtest.client import make_client, read_sentences, scrape
from nerserve.loadtest.runs import closed_loop, open_loop
from nerserve.loadtest.schedule import arrivals
from nerserve.loadtest.stats import percentile

app = typer.Typer(add_completion=False)
PROBE_RATE = 50.0  # requests a second without a key, and as many with a wrong one


def _statuses(run: dict[str, Any]) -> dict[str, int]:
    return dict(run["status_counts"])


def refused_at_door(url: str, rate: float, seconds: float) -> dict[str, Any]:
    """Requests without a key and with a wrong one, alternately, evenly spaced at `rate` a second
    (one sender: evenly, so that none waits for the one before), each latency counted from when it
    was due. Sent from a process of its own over two keep-alive sockets, the request bytes made
    once: the figure is the server's answer, not a client's own work (a probe on team-a's event
    loop adds that loop's lag, an HTTP library its parsing: each a ms at the p99 on a shared core)."""
    target = urlsplit(url)
    body = json.dumps({"texts": ["EU rejects German call to boycott British lamb ."]}).encode()
    head = f"POST /extract?model=span-conll03 HTTP/1.1\r\nhost: {target.netloc}\r\ncontent-type: application/json\r\n"
    requests = [
        f"{head}{auth}content-length: {len(body)}\r\n\r\n".encode() + body
        for auth in ("", "authorization: Bearer wrong-" + "x" * 30 + "\r\n")
    ]
    sockets = [socket.create_connection((target.hostname, target.port)) for _ in requests]
    for sock in sockets:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    latencies: list[float] = []
    statuses: dict[str, int] = {}
    start = time.perf_counter()
    for index, due in enumerate(arrivals(rate, seconds, "constant")):
        time.sleep(max(0.0, start + due - time.perf_counter()))
        sockets[index % 2].sendall(requests[index % 2])
        status = _read_response(sockets[index % 2])
        latencies.append(1000 * (time.perf_counter() - start - due))
        statuses[status] = statuses.get(status, 0) + 1
    for sock in sockets:
        sock.close()
    return {"latencies_ms": latencies, "statuses": statuses}


def _read_response(sock: socket.socket) -> str:
    """One whole response (headers, then Content-Length bytes of body); its status code."""
    received = b""
    while b"\r\n\r\n" not in received:
        received += sock.recv(65536)
    head, _, body = received.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    length = next(int(line.split(":")[1]) for line in lines if line.lower().startswith("content-length:"))
    while len(body) < length:
        body += sock.recv(65536)
    return lines[0].split(" ")[1]


async def door_at_capacity(
    url: str, key_a: str, sentences: list[list[str]], seconds: float, open_rate: float | None = None
) -> dict[str, Any]:
    """team-a at capacity: a closed loop at 32 connections (whole batches of answers leave the
    server at once), or with `open_rate` an open loop at that rate (answers spread out), while the
    door's refusals are timed from another process."""
    loop = asyncio.get_running_loop()
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as prober:
        await loop.run_in_executor(prober, time.sleep, 0)  # the probe's process started before the load
        async with make_client(url, 2000, key_a) as team_a:
            before = await scrape(team_a)
            if open_rate is None:
                at_capacity = closed_loop(team_a, "span-conll03", sentences, 32, seconds)
            else:
                at_capacity = open_loop(team_a, "span-conll03", sentences, open_rate, seconds, seed=5)
            load, door = await asyncio.gather(
                at_capacity, loop.run_in_executor(prober, refused_at_door, url, 2 * PROBE_RATE, seconds)
            )
            after = await scrape(team_a)
    refused = door["latencies_ms"]
    key = 'nerserve_key_requests_total{key="unknown",status="401"}'
    counted = after.get(key, 0.0) - before.get(key, 0.0)
    sent = door["statuses"].get("401", 0)
    return {
        "team_a_load": "closed loop, 32 connections" if open_rate is None else f"open loop, {open_rate:g} requests/s",
        "team_a_sentences_per_second": load["sentences_per_second"],
        "team_a_statuses": _statuses(load),
        "refused_401": sent,
        "door_statuses": door["statuses"],
        "p50_401_ms": percentile(refused, 50),
        "p99_401_ms": percentile(refused, 99),
        "max_401_ms": max(refused, default=math.nan),
        "counted_in_metrics": counted,
        "passed": sent == len(refused) > 0 and percentile(refused, 99) <= 5.0 and counted == sent,
    }


async def ceiling(url: str, key_a: str, key_b: str, sentences: list[list[str]], limit: float, seconds: float) -> dict[str, Any]:
    rate = 2 * limit
    async with make_client(url, 256, key_a) as team_a, make_client(url, 256, key_b) as team_b:
        run_a, run_b = await asyncio.gather(
            open_loop(team_a, "span-conll03", sentences, rate, seconds, seed=3),
            open_loop(team_b, "span-conll03", sentences, rate, seconds, seed=4),
        )
    answered_b = _statuses(run_b).get("200", 0) / seconds
    return {
        "offered_each_per_second": rate,
        "ceiling_b": limit,
        "team_a_statuses": _statuses(run_a),
        "team_b_statuses": _statuses(run_b),
        "team_b_answered_per_second": answered_b,
        # within its ceiling (plus the one second's worth a full bucket holds at the start)
        "passed": _statuses(run_a) == {"200": run_a["requests"]} and answered_b <= limit * (1 + 1 / seconds) + 1e-9,
    }


@app.command()
def main(
    url: Annotated[str, typer.Option()] = "http://127.0.0.1:8047",
    key_a: Annotated[str, typer.Option(envvar="KEY_A")] = "",
    key_b: Annotated[str, typer.Option(envvar="KEY_B")] = "",
    ceiling_b: Annotated[float, typer.Option(help="team-b's configured sentences/s")] = 20.0,
    data: Annotated[Path, typer.Option()] = Path("../shared/data/conll03"),
    seconds: Annotated[float, typer.Option()] = 20.0,
    out: Annotated[Path | None, typer.Option()] = None,
) -> None:
    sentences = read_sentences(data)

    async def everything() -> dict[str, Any]:
        door = await door_at_capacity(url, key_a, sentences, seconds)
        capacity = round(door["team_a_sentences_per_second"])
        door_open = await door_at_capacity(url, key_a, sentences, seconds, open_rate=capacity)
        shared = await fair_share(url, sentences, 2.0, big_key=key_a, small_key=key_b)
        capped = await ceiling(url, key_a, key_b, sentences, ceiling_b, seconds / 2)
        return {
            "door_at_capacity": door,
            "door_at_capacity_open_loop": door_open,
            "fair_share_by_key": shared,
            "ceiling": capped,
        }

    result = asyncio.run(everything())
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")
    shared, capped = result["fair_share_by_key"], result["ceiling"]
    for door in (result["door_at_capacity"], result["door_at_capacity_open_loop"]):
        typer.echo(
            f"1. door at capacity (team-a: {door['team_a_load']}, {door['team_a_sentences_per_second']:.1f} sentences/s): "
            f"{door['refused_401']} 401s, p50 {door['p50_401_ms']:.2f} ms, p99 {door['p99_401_ms']:.2f} ms (≤ 5), "
            f"counted {door['counted_in_metrics']:.0f}: " + ("pass" if door["passed"] else "FAIL")
        )
    typer.echo(
        f"2. fair share by key: team-b's one-sentence requests {[s['status'] for s in shared['small']]}, "
        f"max {shared['small_max_seconds']:.2f} s (≤ 1) beside team-a's 200,000 words: "
        + ("pass" if shared["passed"] else "FAIL")
    )
    typer.echo(
        f"3. ceiling {capped['ceiling_b']:g}/s on team-b, each offering {capped['offered_each_per_second']:g}/s: team-a "
        f"{capped['team_a_statuses']}, team-b {capped['team_b_statuses']} "
        f"({capped['team_b_answered_per_second']:.1f} answered/s): " + ("pass" if capped["passed"] else "FAIL")
    )


if __name__ == "__main__":
    app()
