"""The requests a careless client sends (the reliability issue's list), each against a running
server: its status, error code and how long the answer took. Then the largest request a server
takes, sent while small requests keep arriving: how long it takes, and what the small ones waited
beside it. Last, the server's own response counters against what this script saw, status by status.

    nerserve serve --models span-conll03,diffusion-conll03 --threads 1 --port 8043        # core 0
    python benchmarks/pathological.py --url http://127.0.0.1:8043 --out docs/reference-run/pathological

The cases that must never be a 500, a hang or a crash: they pass when their status is one of
those expected and every answer is JSON.
"""

from __future__ import annotations

import asyncio
import json
import socket
import statistics
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit

import httpx
import typer

from nerserve.loadtest.client import parse_metrics, read_sentences
from nerserve.loadtest.stats import percentile

app = typer.Typer(add_completion=False)
HYPHENS = "a-a-a-a-a-a-a-a-a-a"  # 19 sub-words a word
JSON = {"content-type": "application/json"}


@dataclass(frozen=True)
class Case:
    name: str
    body: bytes
    expected: tuple[int, ...]
    headers: dict[str, str]
    method: str = "POST"


@dataclass
class Outcome:
    name: str
    status: int
    code: str | None
    field: str | None
    seconds: float
    json_body: bool
    passed: bool


def _json_case(name: str, payload: dict[str, Any], *expected: int, **headers: str) -> Case:
    return Case(name, json.dumps(payload).encode(), expected, {**JSON, **headers})


def content_cases(sentences: list[list[str]]) -> list[Case]:
    text = " ".join(sentences[0])
    words_200k: list[str] = []
    for sentence in sentences * (200_000 // sum(map(len, sentences)) + 1):
        words_200k.extend(sentence)
        if len(words_200k) >= 200_000:
            break
    return [
        _json_case("one word of 300 hyphens (601 sub-words)", {"texts": ["a-" * 300 + "a"]}, 200),
        _json_case("600 CJK characters without a space", {"texts": ["漢" * 600]}, 200),
        Case("lone surrogate in texts", b'{"texts": ["a\\ud800b"]}', (422,), JSON),
        Case("lone surrogate in tokens", b'{"tokens": [["a", "\\udfff"]]}', (422,), JSON),
        _json_case("100 words of a-a-a-a-a-a-a-a-a-a", {"texts": [" ".join([HYPHENS] * 100)]}, 200),
        _json_case("2,100 words of a-a-a-a-a-a-a-a-a-a", {"texts": [" ".join([HYPHENS] * 2100)]}, 200, 413),
        _json_case("one text of 200,000 words", {"texts": [" ".join(words_200k)]}, 413),
        _json_case(
            "diffusion proposals 500 × steps 50",
            {"model": "diffusion-conll03", "texts": [text], "options": {"proposals": 500, "steps": 50}},
            422,
        ),
        _json_case("deadline_ms: true", {"texts": [text], "deadline_ms": True}, 422),
        _json_case('deadline_ms: "100"', {"texts": [text], "deadline_ms": "100"}, 422),
        _json_case("options.threshold: true", {"texts": [text], "options": {"threshold": True}}, 422),
        _json_case('options.threshold: "0.5"', {"texts": [text], "options": {"threshold": "0.5"}}, 422),
        _json_case('model: ""', {"texts": [text], "model": ""}, 422),
        _json_case("X-Deadline-Ms: nan", {"texts": [text]}, 422, **{"x-deadline-ms": "nan"}),
        Case("valid JSON sent as text/plain", json.dumps({"texts": [text]}).encode(), (415,), {"content-type": "text/plain"}),
        Case("GET /extract", b"", (405,), {}, method="GET"),
        Case("malformed JSON", b'{"texts": [', (400,), JSON),
    ]


def send(client: httpx.Client, case: Case) -> Outcome:
    start = time.perf_counter()
    response = client.request(case.method, "/extract", content=case.body or None, headers=case.headers)
    seconds = time.perf_counter() - start
    try:
        error = response.json().get("error") or {}
        json_body = True
    except ValueError:
        error, json_body = {}, False
    passed = response.status_code in case.expected and json_body
    if case.method == "GET":
        passed = passed and "POST" in response.headers.get("allow", "")
    return Outcome(case.name, response.status_code, error.get("code"), error.get("field"), seconds, json_body, passed)


def raw_exchange(url: str, head: bytes, pause: float = 0.0, timeout: float = 30.0) -> tuple[int, float]:
    """A request written by hand on a socket (what no HTTP client sends): the status line of the
    answer and the seconds it took. `pause` waits before reading, headers unfinished."""
    parts = urlsplit(url)
    start = time.perf_counter()
    with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 80), timeout=timeout) as conn:
        conn.sendall(head)
        if pause:
            time.sleep(pause)
        answer = conn.recv(4096)
    status = int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/") else 0
    return status, time.perf_counter() - start


def socket_cases(url: str) -> list[Outcome]:
    big = b"POST /extract HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 50000000\r\n\r\n"
    status, seconds = raw_exchange(url, big)
    outcomes = [Outcome("50 MB body announced (413 before it is read)", status, None, None, seconds, True, status == 413)]
    slow = b"POST /extract HTTP/1.1\r\nhost: x\r\n"  # the headers never end
    status, seconds = raw_exchange(url, slow)
    outcomes.append(Outcome("headers that never end", status, None, None, seconds, True, status == 408))
    return outcomes


async def beside_a_large_request(url: str, sentences: list[list[str]], rate: float) -> dict[str, Any]:
    """Nearly the largest request the server takes (one text of max_request_sentences − 100
    sentences, a blank line between them), while one-sentence requests arrive at `rate` a second:
    its time and theirs."""
    limit = httpx.get(f"{url}/info").json()["limits"]["max_request_sentences"] - 100
    large = [sentences[i % len(sentences)] for i in range(limit)]
    text = "\n\n".join(" ".join(sentence) for sentence in large)
    small_latencies: list[float] = []
    statuses: Counter[int] = Counter()
    async with httpx.AsyncClient(base_url=url, timeout=300) as client:

        async def one(sentence: list[str]) -> None:
            start = time.perf_counter()
            response = await client.post("/extract", json={"tokens": [sentence]})
            statuses[response.status_code] += 1
            if response.status_code == 200:
                small_latencies.append(time.perf_counter() - start)

        async def flow(stop: asyncio.Event) -> None:
            tasks = []
            index = 0
            while not stop.is_set():
                tasks.append(asyncio.create_task(one(sentences[index % len(sentences)])))
                index += 1
                await asyncio.sleep(1 / rate)
            await asyncio.gather(*tasks)

        stop = asyncio.Event()
        flowing = asyncio.create_task(flow(stop))
        await asyncio.sleep(2.0)
        start = time.perf_counter()
        response = await client.post("/extract", json={"texts": [text]})
        large_seconds = time.perf_counter() - start
        statuses[response.status_code] += 1
        stop.set()
        await flowing
    milliseconds = [1000 * s for s in small_latencies]
    return {
        "large_sentences": limit,
        "large_words": sum(map(len, large)),
        "large_status": response.status_code,
        "large_seconds": large_seconds,
        "small_rate": rate,
        "small_answered": len(small_latencies),
        "small_p50_ms": statistics.median(milliseconds) if milliseconds else None,
        "small_p99_ms": percentile(milliseconds, 99) if milliseconds else None,
        "statuses": dict(statuses),
    }


def response_counts(url: str) -> Counter[str]:
    counts: Counter[str] = Counter()
    for key, value in parse_metrics(httpx.get(f"{url}/metrics").text).items():
        if key.startswith("nerserve_requests_total{"):
            counts[key.split('status="')[1].split('"')[0]] += int(value)
    return counts


@app.command()
def main(
    url: Annotated[str, typer.Option(help="a running server with span-conll03 and diffusion-conll03")],
    data: Annotated[Path, typer.Option(help="CoNLL-2003 folder (test split)")] = Path("../shared/data/conll03"),
    out: Annotated[Path | None, typer.Option(help="folder for pathological.json")] = None,
    small_rate: Annotated[float, typer.Option(help="one-sentence requests a second beside the large one")] = 20.0,
) -> None:
    sentences = read_sentences(data)
    before = response_counts(url)
    with httpx.Client(base_url=url, timeout=300) as client:
        outcomes = [send(client, case) for case in content_cases(sentences)]
    outcomes += socket_cases(url)
    beside = asyncio.run(beside_a_large_request(url, sentences, small_rate))
    after = response_counts(url)
    sent: Counter[str] = Counter(str(o.status) for o in outcomes if o.status)
    sent.update({str(status): n for status, n in beside["statuses"].items()})
    sent["200"] += 2  # GET /info, and the first GET /metrics (counted after it answered)
    counted = {status: after[status] - before[status] for status in set(after) | set(before)}
    counted = {status: n for status, n in counted.items() if n}
    for outcome in outcomes:
        mark = "ok" if outcome.passed else "FAIL"
        print(f"{mark:4} {outcome.status} {outcome.code or '':22} {1000 * outcome.seconds:9.1f} ms  {outcome.name}")
    print(json.dumps(beside, indent=2))
    print(f"sent (by status): {dict(sent)}\ncounted by /metrics: {counted}")
    result = {"cases": [asdict(o) for o in outcomes], "beside_a_large_request": beside, "sent": dict(sent), "counted": counted}
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "pathological.json").write_text(json.dumps(result, indent=2) + "\n")
    if not all(o.passed for o in outcomes):
        raise typer.Exit(1)


if __name__ == "__main__":
    app()
