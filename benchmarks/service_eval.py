"""Strict F1 of a model *through the service*: a data split's sentences posted as `tokens` to a
running nerserve (batches of --batch sentences per request), an open-label model asked for the
data's own label names (labels.json), the answers' `token_spans` scored against the gold.

    nerserve serve --models gner-open --port 8031 &
    python benchmarks/service_eval.py --url http://127.0.0.1:8031 --model gner-open --data ../shared/data/conll03
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated

import httpx
import typer

from nerserve.ner.data import named_split
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
) -> None:
    sentences, labels = named_split(data, split, limit)
    predictions: list[EntitySet] = []
    started = time.perf_counter()
    with httpx.Client(base_url=url, timeout=600) as client:
        for i in range(0, len(sentences), batch):
            chunk = sentences[i : i + batch]
            body: dict[str, object] = {"model": model, "tokens": [list(s.tokens) for s in chunk]}
            if open_labels:
                body["labels"] = list(labels)
            response = client.post("/extract", json=body)
            response.raise_for_status()
            for result in response.json()["results"]:
                found = [Entity(e["type"], tuple(tuple(f) for f in e["token_spans"])) for e in result["entities"]]
                predictions.append(EntitySet(found))
    seconds = time.perf_counter() - started
    report = evaluate((s.entities, p) for s, p in zip(sentences, predictions, strict=True))
    summary = {k: report[k] for k in ("precision", "recall", "f1")}
    typer.echo(
        json.dumps(
            {
                "model": model,
                "data": str(data),
                "split": split,
                "sentences": len(sentences),
                "labels": list(labels) if open_labels else None,
                "seconds": seconds,
                **summary,
            }
        )
    )


if __name__ == "__main__":
    app()
