"""Open-label speed on this machine, through the exported ONNX graphs (tokenise → graphs →
decode), in one run: gner-open (greedy, constrained) and the label-matching model with the data's
four names, then the label-matching model with 1, 4, 16 and 64 names (what a long list costs: 64
names take three passes of the encoder). CoNLL-2003 test sentences in arrival order, batches of
--batch; F1 where the names are the data's own.

    nerserve export gner-open --format onnx && nerserve export gliner-open --format onnx
    python benchmarks/open_label_speed.py --json-out docs/reference-run/open-label-speed.json
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from nerserve.ner.data import Sentence, named_split
from nerserve.ner.evaluation import evaluate
from nerserve.ner.model_store import Locations
from nerserve.ner.runtime.graph_set import load_graph_set
from nerserve.ner.types import EntitySet

# the folders `nerserve` finds when run where this is (NERSERVE_MODEL_STORE, NERSERVE_GRAPH_CACHE, …)
LOCATIONS = Locations()

app = typer.Typer(add_completion=False)


def timed(program: Any, sentences: list[Sentence], options: Any, batch_size: int) -> tuple[list[EntitySet], float]:
    program.predict([list(sentences[0].tokens)], options)  # warm-up
    predictions: list[EntitySet] = []
    started = time.perf_counter()
    for i in range(0, len(sentences), batch_size):
        predictions += program.predict([list(s.tokens) for s in sentences[i : i + batch_size]], options)
    return predictions, time.perf_counter() - started


def row_of(
    model: str, names: tuple[str, ...], sentences: list[Sentence], program: Any, batch_size: int, own: bool
) -> dict[str, Any]:
    options = dataclasses.replace(program.config.decode, labels=names)
    predictions, seconds = timed(program, sentences, options, batch_size)
    row: dict[str, Any] = {"model": model, "labels": len(names), "sentences": len(sentences)}
    row["sentences_per_second"] = len(sentences) / seconds
    if own:
        row["f1"] = float(evaluate((s.entities, p) for s, p in zip(sentences, predictions, strict=True))["f1"])
    typer.echo(json.dumps(row), err=True)
    return row


@app.command()
def main(
    model: Annotated[str, typer.Option()] = "gliner-open",
    gner: Annotated[str, typer.Option()] = "gner-open",
    data: Annotated[Path, typer.Option()] = Path("../shared/data/conll03"),
    limit: Annotated[int, typer.Option(min=10)] = 500,
    gner_limit: Annotated[int, typer.Option(min=10, help="gner writes every word: fewer sentences")] = 100,
    batch: Annotated[int, typer.Option(min=1)] = 32,
    json_out: Annotated[Path | None, typer.Option()] = None,
) -> None:
    sentences, labels = named_split(data, "test", limit)
    matcher = load_graph_set(LOCATIONS.graph_set_folder(model, "onnx")).program
    generator = load_graph_set(LOCATIONS.graph_set_folder(gner, "onnx")).program
    rows = [
        row_of(gner, labels, sentences[:gner_limit], generator, batch, own=True),
        row_of(model, labels, sentences[:gner_limit], matcher, batch, own=True),
    ]
    # other names than the data's four come from the model's training names, in their order
    others = tuple(n for n in matcher.config.labels if n not in labels)
    for count in (1, 4, 16, 64):
        names = (labels + others)[:count]
        rows.append(row_of(model, names, sentences, matcher, batch, own=count == len(labels)))
    result = {
        "data": str(data),
        "batch": batch,
        "rows": rows,
        "speedup_over_gner_4_labels": rows[1]["sentences_per_second"] / rows[0]["sentences_per_second"],
    }
    typer.echo(json.dumps(result, indent=2))
    if json_out:
        json_out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    app()
