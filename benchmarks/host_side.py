"""Host work per sentence, graphs excluded: what the CPU must do around the device for each
architecture — `prepare` (feeds) and `decode` (outputs → entity sets) of each batch, and around them
what the service does for each request: `plan` (raw text → sentences of words with offsets →
sub-words, in requests of `--per-request` texts of one sentence each) and `assemble` (entity sets →
entities with character offsets) — in sentences per second on whatever cores the process may use
(run it under `taskset -c 0` for one core). Batches are made of the planned sentences, as the
service makes them. The graphs run once per batch (ONNX, untimed) so that decode sees real
outputs. Autoregressive programs interleave host work with their step graphs inside `run`; that
part is not in these figures.

    taskset -c 0 python benchmarks/host_side.py --json-out docs/reference-run/host-side.json
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from nerserve.ner.data import named_split, read_split
from nerserve.ner.model_store import Locations
from nerserve.ner.runtime.graph_set import load_graph_set
from nerserve.service.config import Settings
from nerserve.service.pipeline import PlannedText, Planner, assemble

# the folders `nerserve` finds when run where this is (NERSERVE_MODEL_STORE, NERSERVE_GRAPH_CACHE, …)
LOCATIONS = Locations()

# the service's defaults for long sentences
WINDOW_SUBWORDS = Settings.model_fields["window_subwords"].default
WINDOW_OVERLAP_WORDS = Settings.model_fields["window_overlap_words"].default

app = typer.Typer(add_completion=False)


def best_seconds(work: Callable[[], object], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        work()
        best = min(best, time.perf_counter() - started)
    return best


def measure(
    model: str, sentences: list[list[str]], labels: tuple[str, ...], batch: int, per_request: int, repeats: int
) -> dict[str, Any]:
    loaded = load_graph_set(LOCATIONS.graph_set_folder(model, "onnx"))
    program = loaded.program
    options = program.config.decode
    if labels and "labels" in {f.name for f in dataclasses.fields(options)}:
        options = dataclasses.replace(options, labels=labels)
    window = min(WINDOW_SUBWORDS, program.window_subwords or WINDOW_SUBWORDS)  # as the service windows
    planner = Planner(program.subwords, window, WINDOW_OVERLAP_WORDS, loaded.manifest.words)
    texts = [" ".join(words) for words in sentences]
    requests = [texts[i : i + per_request] for i in range(0, len(texts), per_request)]
    planned = [text for request in requests for text in planner.plan(request)]  # warm-up: the word caches
    units = [unit.sentence for text in planned for unit in text.units]
    batches = [units[i : i + batch] for i in range(0, len(units), batch)]
    prepared = [program.prepare(b) for b in batches]  # warm-up (allocations)
    outputs = [program.run(p, options) for p in prepared]
    found = [entities for p, o in zip(prepared, outputs, strict=True) for entities in program.decode(p, o, options)]
    per_text = [found[i : i + len(text.units)] for i, text in zip(unit_starts(planned), planned, strict=True)]
    seconds = {
        "plan": best_seconds(lambda: [planner.plan(request) for request in requests], repeats),
        "prepare": best_seconds(lambda: [program.prepare(b) for b in batches], repeats),
        "decode": best_seconds(
            lambda: [program.decode(p, o, options) for p, o in zip(prepared, outputs, strict=True)], repeats
        ),
        "assemble": best_seconds(lambda: [assemble(t, r) for t, r in zip(planned, per_text, strict=True)], repeats),
    }
    count = len(sentences)
    return {
        "model": model,
        "architecture": type(program).__name__,
        "sentences": count,
        "batch": batch,
        "per_request": per_request,
        **{f"{stage}_us_per_sentence": 1e6 * value / count for stage, value in seconds.items()},
        # the batch's share, what a device waits on between batches
        "host_sentences_per_second": count / (seconds["prepare"] + seconds["decode"]),
        # every stage: what one core does for each sentence a client sends
        "request_host_sentences_per_second": count / sum(seconds.values()),
    }


def unit_starts(planned: list[PlannedText]) -> list[int]:
    """Where each text's units begin in the flat list of every unit."""
    return list(itertools.accumulate((len(text.units) for text in planned[:-1]), initial=0))


@app.command()
def main(
    models: Annotated[str, typer.Option(help="comma-separated models with ONNX graph sets")] = (
        "span-conll03,nag-conll03,diffusion-conll03,setgen-conll03,bartner-conll03,gner-open,gliner-open"
    ),
    data: Annotated[Path, typer.Option()] = Path("../shared/data/conll03"),
    limit: Annotated[int, typer.Option(min=1)] = 2048,
    batch: Annotated[int, typer.Option(min=1)] = 256,
    per_request: Annotated[int, typer.Option(min=1, help="texts a request, for plan")] = 32,
    repeats: Annotated[int, typer.Option(min=1)] = 3,
    json_out: Annotated[Path | None, typer.Option()] = None,
) -> None:
    sentences = [list(s.tokens) for s in read_split(data, "test", limit)]
    _, labels = named_split(data, "test", 1)
    rows = []
    for model in models.split(","):
        rows.append(measure(model, sentences, labels, batch, per_request, repeats))
        typer.echo(json.dumps(rows[-1]), err=True)
    result = {"data": str(data), "rows": rows}
    typer.echo(json.dumps(result, indent=2))
    if json_out:
        json_out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    app()
