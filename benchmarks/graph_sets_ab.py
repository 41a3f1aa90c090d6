"""Two or more exported graph sets of one model, alternating in one process over the CoNLL-2003 test
split (two lanes, batches of 32, as cpu_peer.py scores): words/s and F1 a round, so that a change to
the graphs is measured on the same heap, in the same minutes, without spaCy's own spread.

    python benchmarks/graph_sets_ab.py --rounds 4 before=build/graphs/M/onnx-int8-OLD after=build/graphs/M/onnx-int8-NEW
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from nerserve.ner.data import read_split
from nerserve.ner.runner import score
from nerserve.ner.runtime.graph_set import load_graph_set

app = typer.Typer(add_completion=False)


@app.command()
def main(
    sets: Annotated[list[str], typer.Argument(help="LABEL=FOLDER: a graph set's folder under the graph cache")],
    data: Annotated[Path, typer.Option()] = Path("../shared/data/conll03"),
    rounds: Annotated[int, typer.Option(min=1)] = 4,
    lanes: Annotated[int, typer.Option(min=1)] = 2,
) -> None:
    test = read_split(data, "test")
    programs: dict[str, Any] = {}
    for labelled in sets:
        label, _, folder = labelled.partition("=")
        program = load_graph_set(Path(folder), threads=1).program
        program.predict([list(s.tokens) for s in test[:32]])  # warm-up
        programs[label] = program
    results: dict[str, list[dict[str, float]]] = {label: [] for label in programs}
    for turn in range(rounds):
        for label in list(programs) if turn % 2 == 0 else list(reversed(programs)):
            report = score(programs[label].predict, test, 32, lanes=lanes)
            results[label].append({"words_per_second": round(report["words_per_second"]), "f1": report["f1"]})
    typer.echo(json.dumps(results, indent=2))


if __name__ == "__main__":
    app()
