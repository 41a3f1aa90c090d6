"""Host work per sentence, graphs excluded: what the CPU must do around the device for each
architecture — `prepare` (tokenise, feeds) and `decode` (outputs → entity sets) — in sentences per
second on whatever cores the process may use (run it under `taskset -c 0` for one core). The graphs
run once per batch (ONNX, untimed) so that decode sees real outputs. Autoregressive programs
interleave host work with their step graphs inside `run`; that part is not in these figures.

    taskset -c 0 python benchmarks/host_side.py --json-out docs/reference-run/host-side.json
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from nerserve.ner.data import named_split, read_split
from nerserve.ner.model_store import Locations
from nerserve.ner.runtime.graph_set import load_graph_set

# the folders `nerserve` finds when run where this is (NERSERVE_MODEL_STORE, NERSERVE_GRAPH_CACHE, …)
LOCATIONS = Locations()

app = typer.Typer(add_completion=False)


def measure(model: str, sentences: list[list[str]], labels: tuple[str, ...], batch: int, repeats: int) -> dict[str, Any]:
    program = load_graph_set(LOCATIONS.graph_set_folder(model, "onnx")).program
    options = program.config.decode
    if labels and "labels" in {f.name for f in dataclasses.fields(options)}:
        options = dataclasses.replace(options, labels=labels)
    batches = [sentences[i : i + batch] for i in range(0, len(sentences), batch)]
    prepared = [program.prepare(b) for b in batches]  # warm-up (tokenizer caches, allocations)
    outputs = [program.run(p, options) for p in prepared]
    best_prepare = best_decode = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        prepared = [program.prepare(b) for b in batches]
        prepare_seconds = time.perf_counter() - started
        started = time.perf_counter()
        for p, o in zip(prepared, outputs, strict=True):
            program.decode(p, o, options)
        decode_seconds = time.perf_counter() - started
        best_prepare, best_decode = min(best_prepare, prepare_seconds), min(best_decode, decode_seconds)
    count = len(sentences)
    return {
        "model": model,
        "architecture": type(program).__name__,
        "sentences": count,
        "batch": batch,
        "prepare_us_per_sentence": 1e6 * best_prepare / count,
        "decode_us_per_sentence": 1e6 * best_decode / count,
        "host_sentences_per_second": count / (best_prepare + best_decode),
    }


@app.command()
def main(
    models: Annotated[str, typer.Option(help="comma-separated models with ONNX graph sets")] = (
        "span-conll03,nag-conll03,diffusion-conll03,setgen-conll03,bartner-conll03,gner-open,gliner-open"
    ),
    data: Annotated[Path, typer.Option()] = Path("../shared/data/conll03"),
    limit: Annotated[int, typer.Option(min=1)] = 2048,
    batch: Annotated[int, typer.Option(min=1)] = 256,
    repeats: Annotated[int, typer.Option(min=1)] = 3,
    json_out: Annotated[Path | None, typer.Option()] = None,
) -> None:
    sentences = [list(s.tokens) for s in read_split(data, "test", limit)]
    _, labels = named_split(data, "test", 1)
    rows = []
    for model in models.split(","):
        rows.append(measure(model, sentences, labels, batch, repeats))
        typer.echo(json.dumps(rows[-1]), err=True)
    result = {"data": str(data), "rows": rows}
    typer.echo(json.dumps(result, indent=2))
    if json_out:
        json_out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    app()
