"""The seed papers' efficiency protocols, run through POST /extract at concurrency 1.

- nag (NAG-NER Table 3): one fixed batch of 4 test sentences, sent repeatedly; QPS in sentences/s.
- setgen (SetGNER Table 7): the whole test set, fixed order, batches filled up to 800 source
  tokens (longest × count ≤ 800; the tester has no tokenizer, so a word counts as a token);
- gner (GNER Table 4): the test set in batches of 4.
Warm-up requests are excluded; nag repeats until sentences/s is stable (3 chunks within 2 %).
"""

from __future__ import annotations

import time
from typing import Any

import aiohttp

from nerserve.loadtest.client import Sample, extract
from nerserve.loadtest.stats import is_stable

WARMUP_REQUESTS = 5


def setgen_batches(sentences: list[list[str]], budget: int = 800) -> list[list[list[str]]]:
    batches: list[list[list[str]]] = []
    current: list[list[str]] = []
    for sentence in sentences:
        longest = max([len(s) for s in current] + [len(sentence)])
        if current and longest * (len(current) + 1) > budget:
            batches.append(current)
            current = []
        current.append(sentence)
    if current:
        batches.append(current)
    return batches


def fixed_batches(sentences: list[list[str]], size: int) -> list[list[list[str]]]:
    return [sentences[i : i + size] for i in range(0, len(sentences), size)]


def protocol_batches(table: str, sentences: list[list[str]]) -> tuple[list[list[list[str]]], bool]:
    """(batches, repeat-until-stable) for a table."""
    if table == "nag":
        return [sentences[:4]], True
    if table == "setgen":
        return setgen_batches(sentences), False
    if table == "gner":
        return fixed_batches(sentences, 4), False
    raise ValueError(f"unknown table {table!r}: nag, setgen or gner")


def _rates(samples: list[Sample], seconds: float) -> dict[str, float]:
    sentences = sum(s.sentences for s in samples)
    model_seconds = sum((s.inference_ms or 0.0) for s in samples) / 1000
    return {
        "sentences_per_second": sentences / seconds if seconds else 0.0,
        "model_only_sentences_per_second": sentences / model_seconds if model_seconds else 0.0,
        "sentences": sentences,
        "requests": len(samples),
        "seconds": seconds,
    }


async def run_protocol(
    client: aiohttp.ClientSession,
    model: str,
    batches: list[list[list[str]]],
    repeat: bool,
    max_seconds: float = 120.0,
    options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    for _ in range(WARMUP_REQUESTS):
        await extract(client, model, batches[0], options=options)
    samples: list[Sample] = []
    errors = 0
    start = time.perf_counter()
    if repeat:
        chunk_rates: list[float] = []
        while not is_stable(chunk_rates) and time.perf_counter() - start < max_seconds:
            chunk_start = time.perf_counter()
            # cycle through the batches: the batch-1 reference row sends the same sentences one by one
            chunk = [await extract(client, model, batches[i % len(batches)], options=options) for i in range(20)]
            errors += sum(s.status != 200 for s in chunk)
            samples += chunk
            chunk_rates.append(sum(s.sentences for s in chunk) / (time.perf_counter() - chunk_start))
    else:
        for batch in batches:
            sample = await extract(client, model, batch, options=options)
            errors += sample.status != 200
            samples.append(sample)
    seconds = time.perf_counter() - start
    return {**_rates([s for s in samples if s.status == 200], seconds), "errors": errors}
