"""Run a program over a data split in length-sorted batches and score it (strict F1 + throughput)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tqdm import tqdm

from nerserve.ner.data import Sentence
from nerserve.ner.evaluation import evaluate
from nerserve.ner.types import EntitySet


def length_batches(lengths: Sequence[int], batch_size: int) -> list[list[int]]:
    """Indices grouped into batches of similar length (less padding), in ascending length."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


def predict_all(
    predict: Callable[[list[list[str]]], list[EntitySet]],
    sentences: Sequence[Sentence],
    batch_size: int = 32,
    progress: bool = False,
    lanes: int = 1,
) -> tuple[list[EntitySet], float]:
    """Predictions in input order, and the wall time spent (tokenisation, graphs and decoding).
    `lanes`: batches run at once from that many threads, as the service's graph lanes run them."""
    predictions: list[EntitySet] = [EntitySet()] * len(sentences)
    batches = length_batches([len(s.tokens) for s in sentences], batch_size)

    def run(batch: list[int]) -> list[EntitySet]:
        return predict([list(sentences[i].tokens) for i in batch])

    started = time.perf_counter()
    # one lane runs in the caller's thread: a caller's torch.no_grad() (thread-local) still holds
    with ThreadPoolExecutor(max_workers=lanes) as pool:
        answers = pool.map(run, batches) if lanes > 1 else map(run, batches)
        shown = tqdm(answers, total=len(batches), desc="predict", unit="batch", disable=not progress, leave=False)
        for batch, found in zip(batches, shown, strict=True):
            for index, entities in zip(batch, found, strict=True):
                predictions[index] = entities
    return predictions, time.perf_counter() - started


def score(
    predict: Callable[[list[list[str]]], list[EntitySet]],
    sentences: Sequence[Sentence],
    batch_size: int = 32,
    progress: bool = False,
    lanes: int = 1,
) -> dict[str, Any]:
    predictions, seconds = predict_all(predict, sentences, batch_size, progress, lanes)
    report = evaluate((s.entities, p) for s, p in zip(sentences, predictions, strict=True))
    words = sum(len(s.tokens) for s in sentences)
    report["seconds"] = seconds
    report["sentences_per_second"] = len(sentences) / seconds if seconds else 0.0
    report["words_per_second"] = words / seconds if seconds else 0.0
    report["batch_size"] = batch_size
    return report
