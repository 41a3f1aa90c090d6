"""Fair sharing beside one huge request: while one legal request of 200,000 words runs (one token
list, windowed by the server into a few hundred windows, within max_request_sentences), another
client sends one CoNLL-2003 sentence every 0.5 s for 5 s. Bar: every one of those gets 200, each
within 1 s.

    taskset -c 0 nerserve serve --models span-conll03 --threads 1 --port 8042 &
    taskset -c 1 python benchmarks/fair_share.py --url http://127.0.0.1:8042 [--out FILE.json]
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer

from nerserve.loadtest.client import read_sentences

app = typer.Typer(add_completion=False)
HUGE_WORDS = 200_000
SMALL_EVERY_SECONDS = 0.5
SMALL_FOR_SECONDS = 5.0
SMALL_WITHIN_SECONDS = 1.0


def _headers(key: str | None) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"} if key else {}


async def measure(
    url: str, sentences: list[list[str]], start_after: float, big_key: str | None = None, small_key: str | None = None
) -> dict[str, Any]:
    """`big_key`, `small_key`: the API keys of the two clients (benchmarks/tenants.py), if any."""
    words = [word for sentence in sentences for word in sentence]
    huge = (words * (HUGE_WORDS // len(words) + 1))[:HUGE_WORDS]
    async with (
        httpx.AsyncClient(base_url=url, timeout=600, headers=_headers(big_key)) as big,
        httpx.AsyncClient(base_url=url, timeout=60, headers=_headers(small_key)) as small,
    ):

        async def huge_request() -> tuple[int, float]:
            began = time.perf_counter()
            response = await big.post("/extract", json={"tokens": [huge]})
            return response.status_code, time.perf_counter() - began

        async def one(sentence: list[str]) -> dict[str, Any]:
            began = time.perf_counter()
            response = await small.post("/extract", json={"tokens": [sentence]})
            outcome: dict[str, Any] = {"status": response.status_code, "seconds": round(time.perf_counter() - began, 4)}
            if response.status_code != 200:
                outcome["body"] = response.text[:300]
            return outcome

        began = time.perf_counter()
        running = asyncio.create_task(huge_request())
        await asyncio.sleep(start_after)  # the huge request is parsed, planned and running
        tasks = []
        for index in range(int(SMALL_FOR_SECONDS / SMALL_EVERY_SECONDS)):
            tasks.append(asyncio.create_task(one(sentences[index])))
            await asyncio.sleep(SMALL_EVERY_SECONDS)
        smalls = await asyncio.gather(*tasks)
        huge_running_after = not running.done()
        if huge_running_after:  # its client goes away: the server drops the rest of its sentences
            running.cancel()
        huge_status, huge_seconds = await running if not huge_running_after else (0, time.perf_counter() - began)
    passed = all(s["status"] == 200 and s["seconds"] <= SMALL_WITHIN_SECONDS for s in smalls)
    return {
        "huge_words": HUGE_WORDS,
        "huge_status": huge_status,  # 0: still running when the small ones ended, then cancelled
        "huge_seconds": round(huge_seconds, 2),
        "huge_still_running_when_the_small_ones_ended": huge_running_after,
        "small": smalls,
        "small_max_seconds": max(s["seconds"] for s in smalls),
        "passed": passed and huge_running_after,
    }


@app.command()
def main(
    url: Annotated[str, typer.Option(help="a running server with span-conll03")] = "http://127.0.0.1:8042",
    data: Annotated[Path, typer.Option(help="CoNLL-2003 folder (test split)")] = Path("../shared/data/conll03"),
    start_after: Annotated[float, typer.Option(help="seconds between the huge request and the first small one")] = 2.0,
    out: Annotated[Path | None, typer.Option(help="write the result here (JSON)")] = None,
) -> None:
    result = asyncio.run(measure(url, read_sentences(data), start_after))
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")
    statuses = [s["status"] for s in result["small"]]
    seconds = [s["seconds"] for s in result["small"]]
    if result["huge_still_running_when_the_small_ones_ended"]:
        typer.echo(f"huge request: still running after {result['huge_seconds']} s (then cancelled)")
    else:
        typer.echo(f"huge request: {result['huge_status']} in {result['huge_seconds']} s")
    typer.echo(f"small requests: statuses {statuses}, seconds {seconds}")
    typer.echo("pass" if result["passed"] else "FAIL (bar: every small request 200 within 1 s, beside the huge one)")


if __name__ == "__main__":
    app()
