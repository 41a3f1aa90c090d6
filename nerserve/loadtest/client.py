"""HTTP side: requests to POST /extract with timing, the server's /metrics and /models.

aiohttp, not httpx: on one core httpx's client topped out near 100 requests/s (the generator, not
the server, was then the bottleneck of an overload test); aiohttp's C HTTP parser sends several
times that, so an open loop at 3× a server's capacity is what the server gets."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import random
import re
import time
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, TypeVar

import aiohttp

T = TypeVar("T")


@dataclass
class Sample:
    scheduled: float  # when the request was due (open loop) or sent (closed loop), perf_counter
    finished: float
    status: int
    sentences: int
    words: int
    queue_ms: float | None
    inference_ms: float | None
    retry_after: float | None = None  # seconds, from a 429's Retry-After

    @property
    def latency(self) -> float:
        return self.finished - self.scheduled


def read_sentences(data_dir: Path, split: str = "test") -> list[list[str]]:
    """The tokens of a canonical JSONL split (the tester's own reader: it imports nothing of nerserve)."""
    with (data_dir / f"{split}.jsonl").open(encoding="utf-8") as handle:
        return [json.loads(line)["tokens"] for line in handle if line.strip()]


class Route(StrEnum):
    """Where a load test's requests go: POST /extract (pre-tokenised) or the model's KServe v2 infer (texts)."""

    extract = "extract"
    v2 = "v2"


class Order(StrEnum):
    SHUFFLED = "shuffled"
    FILE = "file"


ORDER_HELP = "the split shuffled (seeded: the same order every run, any first part of it a sample) or in file order"


def arrange(sentences: list[list[str]], order: Order, seed: int = 0) -> list[list[str]]:
    """The order a run sends the split in. A run over a duration sends a prefix of it, and a file's
    order is not a sample of it: CoNLL-2003 test opens with short result tables (its first 1,160
    sentences average 12.7 words, its first 1,750 14.6, the whole split 13.4), so two servers, or
    two concurrencies, that get through different numbers of sentences in the same seconds would be
    timed on different work. `shuffled` (seeded: every run sends the same order) makes every prefix
    a sample of the split; `file` keeps the file's order, as the papers' protocols do."""
    if order is Order.FILE:
        return list(sentences)
    shuffled = list(sentences)
    random.Random(seed).shuffle(shuffled)
    return shuffled


def _header_ms(headers: Mapping[str, str], name: str) -> float | None:
    value = headers.get(name)
    return float(value.removesuffix("ms")) if value else None


def _header_seconds(headers: Mapping[str, str], name: str) -> float | None:
    value = headers.get(name, "")
    return float(value) if value.isdigit() else None  # the date form of Retry-After is not sent by nerserve


async def extract(
    client: aiohttp.ClientSession,
    model: str | None,
    sentences: list[list[str]],
    scheduled: float | None = None,
    options: dict[str, Any] | None = None,
    route: str = "extract",
) -> Sample:
    """`route`: "extract" (POST /extract with pre-tokenised sentences) or "v2" (the KServe v2
    infer route of `model`, the sentences as BYTES texts)."""
    start = scheduled if scheduled is not None else time.perf_counter()
    path, payload = _request(model, sentences, options, route)
    try:
        async with client.post(path, json=payload) as response:
            await response.read()
            status = response.status
            queue_ms = _header_ms(response.headers, "x-queue-time")
            inference_ms = _header_ms(response.headers, "x-inference-time")
            retry_after = _header_seconds(response.headers, "retry-after")
    except (aiohttp.ClientError, TimeoutError):
        status, queue_ms, inference_ms, retry_after = 0, None, None, None  # connection-level failure
    words = sum(map(len, sentences))
    return Sample(start, time.perf_counter(), status, len(sentences), words, queue_ms, inference_ms, retry_after)


def _request(
    model: str | None, sentences: list[list[str]], options: dict[str, Any] | None, route: str
) -> tuple[str, dict[str, Any]]:
    if route == "v2":
        texts = [" ".join(sentence) for sentence in sentences]
        tensor = {"name": "text", "shape": [len(texts)], "datatype": "BYTES", "data": texts}
        return f"/v2/models/{model}/infer", {"inputs": [tensor], "parameters": dict(options or {})}
    payload: dict[str, Any] = {"tokens": sentences}
    if model:
        payload["model"] = model
    if options:
        payload["options"] = options
    return "/extract", payload


_METRIC = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+([-+0-9.eEinfINFNa]+)$")


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text → {"name{labels}": value} (labels kept verbatim)."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        match = _METRIC.match(line.strip())
        if match:
            values[match.group(1) + (match.group(2) or "")] = float(match.group(3))
    return values


async def scrape(client: aiohttp.ClientSession) -> dict[str, float]:
    async with client.get("/metrics", raise_for_status=True) as response:
        return parse_metrics(await response.text())


def metric_delta(before: dict[str, float], after: dict[str, float], name: str, model: str) -> float:
    key = f'{name}{{model="{model}"}}'
    return after.get(key, 0.0) - before.get(key, 0.0)


def server_split(before: dict[str, float], after: dict[str, float], model: str, seconds: float) -> dict[str, float]:
    """The server's own view of a run: queue vs inference time, batch size, tokens/s."""

    def mean(name: str) -> float:
        count = metric_delta(before, after, f"{name}_count", model)
        return metric_delta(before, after, f"{name}_sum", model) / count if count else 0.0

    graph_seconds = metric_delta(before, after, "nerserve_inference_seconds_sum", model)
    # the process that answers /metrics: the engine process where HTTP workers front it, the whole
    # server where it runs as one process
    cpu_seconds = after.get("process_cpu_seconds_total", 0.0) - before.get("process_cpu_seconds_total", 0.0)
    sentences = metric_delta(before, after, "nerserve_sentences_total", model)
    return {
        "server_queue_ms_mean": mean("nerserve_queue_seconds") * 1000,
        "server_batch_inference_ms_mean": mean("nerserve_inference_seconds") * 1000,
        "server_batch_size_mean": mean("nerserve_batch_sentences"),
        "server_padding_ratio_mean": mean("nerserve_batch_padding_ratio"),
        "server_tokens_per_second": metric_delta(before, after, "nerserve_tokens_total", model) / seconds,
        # The same batches as the graphs ran them (graphs + decode, in the server's worker
        # thread): the offline speed the service overhead is measured against.
        "server_graph_sentences_per_second": sentences / graph_seconds if graph_seconds else 0.0,
        "server_graph_busy_fraction": graph_seconds / seconds if seconds else 0.0,
        # whether that process's cores are what limits it (its event loop, prepare and graph
        # launches share one interpreter lock: near 1.0 and no further)
        "server_process_cpu_seconds": cpu_seconds,
        "server_process_cores_busy": cpu_seconds / seconds if seconds else 0.0,
    }


_LABEL = re.compile(r'(\w+)="([^"]*)"')


def growth_by_label(
    before: dict[str, float], after: dict[str, float], name: str, label: str, model: str | None = None
) -> dict[str, float]:
    """A counter's growth between two scrapes by one label's value (of MODEL's series only, where
    given): `nerserve_thread_cpu_seconds_total` by "role" → {"loop": 1.2, "graphs": 3.4, …}."""
    grown: dict[str, float] = {}
    for key, value in after.items():
        if not key.startswith(name + "{"):
            continue
        labels = dict(_LABEL.findall(key[len(name) :]))
        if label in labels and (model is None or labels.get("model") == model):
            grown[labels[label]] = grown.get(labels[label], 0.0) + value - before.get(key, 0.0)
    return grown


async def model_info(client: aiohttp.ClientSession, model: str | None) -> dict[str, Any]:
    async with client.get("/models", raise_for_status=True) as response:
        body = await response.json()
    name = model or body["default"]
    for entry in body["models"]:
        if entry["name"] == name:
            return dict(entry)
    raise SystemExit(f"model {name!r} is not served at this URL")


def make_client(url: str, connections: int, api_key: str | None = None) -> aiohttp.ClientSession:
    """Keep-alive connections, at most `connections` at once (open loop: more requests wait in the
    client, and their latency, counted from the scheduled time, shows it); `api_key` sent as a
    bearer token on every request."""
    connector = aiohttp.TCPConnector(limit=connections, limit_per_host=connections)
    headers = {"authorization": f"Bearer {api_key}"} if api_key else None
    return aiohttp.ClientSession(base_url=url, connector=connector, timeout=aiohttp.ClientTimeout(total=120.0), headers=headers)


def model_row(spec: str) -> tuple[str, dict[str, Any]]:
    """`name` or `name?key=value&key=value` (a table row with per-request options, e.g.
    `diffusion-conll03?steps=1`) → (name, options); values are read as JSON (numbers, booleans)."""
    name, _, query = spec.partition("?")
    options: dict[str, Any] = {}
    for pair in filter(None, query.split("&")):
        key, _, value = pair.partition("=")
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    return name, options


def run_event_loop(main: Coroutine[Any, Any, T]) -> T:
    """uvloop where installed: the client then sends several times what asyncio's own loop does on
    one core, so that an open loop at 3× a server's capacity is what the server gets."""
    if not has_uvloop():
        return asyncio.run(main)
    import uvloop

    return uvloop.run(main)


def has_uvloop() -> bool:
    return importlib.util.find_spec("uvloop") is not None
