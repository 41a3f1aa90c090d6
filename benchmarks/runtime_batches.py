"""Milliseconds a batch of random test sentences takes through one CPU runtime (graphs, prepare and
decoding), by batch size, and each graph's share: where a runtime's fixed cost per call shows
(docs/decisions/cpu-inference.md, "bf16 on a CPU with AMX").

    OMP_NUM_THREADS=1 taskset -c 1 python benchmarks/runtime_batches.py --runs onnx,onnx-int8,openvino,openvino-bf16
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer

from nerserve.ner.data import read_split
from nerserve.ner.graph_format import EXPORT_JSON, Runtime
from nerserve.ner.model_store import Locations
from nerserve.ner.runtime.graph_set import load_graph_set

LOCATIONS = Locations()
# a run's name → (the runtime, INT8 graphs, the precision)
RUNS = {
    "onnx": (Runtime.onnx, False, "fp32"),
    "onnx-int8": (Runtime.onnx, True, "fp32"),
    "openvino": (Runtime.openvino, False, "fp32"),
    "openvino-bf16": (Runtime.openvino, False, "bf16"),
}

app = typer.Typer(add_completion=False)


def time_calls(graph: Any, name: str, spent: dict[str, float]) -> None:
    """GRAPH's calls add their seconds to `spent[name]` (its own `run`, wrapped where programs hold it)."""
    run = graph.run

    def timed(inputs: Mapping[str, Any], keep_on_device: Any = ()) -> dict[str, Any]:
        started = time.perf_counter()
        outputs: dict[str, Any] = run(inputs, keep_on_device)
        spent[name] = spent.get(name, 0.0) + time.perf_counter() - started
        return outputs

    graph.run = timed


def per_batch(model: str, run: str, sentences: list[list[str]], sizes: list[int], seed: int) -> dict[str, Any]:
    runtime, int8, precision = RUNS[run]
    folder = LOCATIONS.graph_set_folder(model, "onnx", int8)
    if not (folder / EXPORT_JSON).is_file():
        raise typer.BadParameter(f"no export at {folder}: nerserve export {model}{' --int8' if int8 else ''}")
    program = load_graph_set(folder, threads=1, runtime=runtime, precision=precision).program
    spent: dict[str, float] = {}
    for name, graph in program.graphs.items():
        time_calls(graph, name, spent)
    rows: dict[str, Any] = {}
    picks = np.random.default_rng(seed)
    for size in sizes:
        batches = [[sentences[i] for i in picks.integers(0, len(sentences), size)] for _ in range(max(8, 256 // size))]
        for batch in batches[:3]:  # warm-up
            program.predict(batch)
        spent.clear()
        started = time.perf_counter()
        for batch in batches:
            program.predict(batch)
        count = len(batches)
        rows[str(size)] = {"ms_per_batch": round(1000 * (time.perf_counter() - started) / count, 2)} | {
            f"{name}_ms": round(1000 * seconds / count, 2) for name, seconds in spent.items()
        }
    return {"model": model, "run": run, "batches": rows}


@app.command()
def main(
    runs: Annotated[str, typer.Option(help=f"comma-separated, of {', '.join(RUNS)}")] = ",".join(RUNS),
    model: Annotated[str, typer.Option()] = "span-conll03",
    data: Annotated[Path, typer.Option()] = Path("../shared/data/conll03"),
    sizes: Annotated[str, typer.Option(help="batch sizes")] = "1,4,16,32",
    seed: Annotated[int, typer.Option()] = 0,
) -> None:
    sentences = [list(s.tokens) for s in read_split(data, "test")]
    for run in runs.split(","):
        if run not in RUNS:
            raise typer.BadParameter(f"{run!r}: one of {', '.join(RUNS)}", param_hint="--runs")
        typer.echo(json.dumps(per_batch(model, run, sentences, [int(size) for size in sizes.split(",")], seed)))


if __name__ == "__main__":
    app()
