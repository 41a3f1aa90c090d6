"""DiffusionNER's Figure 3 as a table: strict F1 and sentences/s for every (denoising steps, K)
through a model's exported graphs (tokenise → encoder → steps × denoiser → decode, no HTTP).

    python benchmarks/diffusion_steps.py --model diffusion-genia --data ../shared/data/genia --json
"""

from __future__ import annotations

import json
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Annotated, Any

import typer

from nerserve.ner.data import read_split
from nerserve.ner.graph_format import EXPORT_JSON
from nerserve.ner.model_store import Locations
from nerserve.ner.runner import score
from nerserve.ner.runtime.graph_set import load_graph_set

# the folders `nerserve` finds when run where this is (NERSERVE_MODEL_STORE, NERSERVE_GRAPH_CACHE, …)
LOCATIONS = Locations()

app = typer.Typer(add_completion=False)


def parse_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


@app.command()
def main(
    model: Annotated[str, typer.Option()] = "diffusion-genia",
    data: Annotated[Path, typer.Option()] = Path("../shared/data/genia"),
    split: Annotated[str, typer.Option()] = "test",
    runtime: Annotated[str, typer.Option()] = "onnx",
    steps: Annotated[str, typer.Option(help="comma-separated step counts")] = "1,2,5,10",
    proposals: Annotated[str, typer.Option(help="comma-separated K values")] = "20,60,100",
    batch_size: Annotated[int, typer.Option(min=1)] = 32,
    limit: Annotated[int | None, typer.Option(min=1)] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    folder = LOCATIONS.graph_set_folder(model, runtime)
    if not (folder / EXPORT_JSON).is_file():
        raise typer.BadParameter(f"no {runtime} export of {model}: run `nerserve export {model} --format {runtime}`")
    program = load_graph_set(folder).program
    sentences = read_split(data, split, limit)
    defaults = program.config.decode
    program.predict([list(sentences[0].tokens)])  # warm-up
    rows: list[dict[str, Any]] = []
    for k in parse_list(proposals):
        for n in parse_list(steps):
            options = replace(defaults, proposals=k, steps=n)
            report = score(partial(program.predict, options=options), sentences, batch_size)
            row = {
                "proposals": k,
                "steps": n,
                "precision": report["precision"],
                "recall": report["recall"],
                "f1": report["f1"],
                "sentences_per_second": report["sentences_per_second"],
            }
            rows.append(row)
            if not as_json:
                typer.echo(f"K={k:>4} steps={n:>3}  F1 {row['f1']:.4f}  {row['sentences_per_second']:.1f} sentences/s")
    result = {
        "model": model,
        "split": split,
        "runtime": runtime,
        "sentences": len(sentences),
        "batch_size": batch_size,
        "seed": defaults.seed,
        "threshold": defaults.threshold,
        "rows": rows,
    }
    if as_json:
        typer.echo(json.dumps(result))


if __name__ == "__main__":
    app()
