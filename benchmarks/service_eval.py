"""Strict F1 of a model *through the service*: a data split's sentences posted as `tokens` to a
running nerserve (batches of --batch sentences per request), an open-label model asked for the
data's own label names (labels.json), the answers' `token_spans` scored against the gold. Several
runs may share one server: a 429 is retried after its Retry-After (nerserve.client).

    nerserve serve --models gner-open --port 8031 &
    python benchmarks/service_eval.py --url http://127.0.0.1:8031 --model gner-open --data ../shared/data/conll03
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated

import typer

from nerserve.client import Client
from nerserve.ner.data import named_split, read_split
from nerserve.ner.evaluation import evaluate
from nerserve.ner.types import Entity, EntitySet

app = typer.Typer(add_completion=False)


@app.command()
def main(
    model: Annotated[str, typer.Option()],
    data: Annotated[Path, typer.Option()],
    url: Annotated[str, typer.Option()] = "http://127.0.0.1:8000",
    split: Annotated[str, typer.Option()] = "test",
    batch: Annotated[int, typer.Option(min=1)] = 32,
    limit: Annotated[int | None, typer.Option(min=1)] = None,
    open_labels: Annotated[bool, typer.Option(help="send the data's label names as `labels`")] = True,
    options: Annotated[str, typer.Option(help="the request's `options` as JSON, e.g. '{\"nested\": true}'")] = "{}",
    json_out: Annotated[Path | None, typer.Option(help="also write the result here")] = None,
    lowercase: Annotated[bool, typer.Option(help="send every word lowercased (as queries are often typed)")] = False,
) -> None:
    # an open-label model is asked for the natural names and answers with them; any other model
    # answers with the data's own types
    sentences, labels = named_split(data, split, limit) if open_labels else (read_split(data, split, limit), ())
    predictions: list[EntitySet] = []
    started = time.perf_counter()
    # the client retries a 429 after its Retry-After, so several evaluations may share one server
    with Client(url, timeout=600, batch_size=batch, max_retries=100, max_wait=3600) as client:
        answers = client.extract_stream(
            [[word.lower() if lowercase else word for word in s.tokens] for s in sentences],
            model,
            labels=list(labels) if open_labels else None,
            options=json.loads(options),
        )
        for found in answers:
            predictions.append(EntitySet([Entity(e.type, tuple(e.token_spans)) for e in found]))
    seconds = time.perf_counter() - started
    report = evaluate((s.entities, p) for s, p in zip(sentences, predictions, strict=True))
    summary = {k: report[k] for k in ("precision", "recall", "f1")}
    result = {
        "model": model,
        "data": str(data),
        "split": split,
        "sentences": len(sentences),
        "labels": list(labels) if open_labels else None,
        "options": json.loads(options),
        "lowercase": lowercase,
        "seconds": seconds,
        **summary,
    }
    typer.echo(json.dumps(result))
    if json_out:
        json_out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    app()
