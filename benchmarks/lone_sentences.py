"""Each test sentence of a model's data sent alone through its exported ONNX graphs, as a lone
request on an idle server is: how many the graphs fail, how many answer no entity. A lone sentence
is where a graph meets its empty tensors (a span proposal whose seeds all miss the filter), which
an ONNX Runtime release may handle differently from the one the export was checked with
(docs/decisions/export-parity.md). One JSON line a model.

    python benchmarks/lone_sentences.py --models span-conll03 [--limit 300]
    # under another release: benchmarks/gpu_compat.sh's venv, with graphs it exported
    NERSERVE_GRAPH_CACHE=/tmp/ort131 /tmp/gpu-compat/bin/python benchmarks/lone_sentences.py --models …
"""

from __future__ import annotations

import json
import time
from typing import Annotated

import onnxruntime
import typer

from nerserve.ner.data import read_split
from nerserve.ner.model_store import Locations, read_manifest
from nerserve.ner.runtime.graph_set import load_graph_set

app = typer.Typer(add_completion=False)


def lone_sentences(locations: Locations, model: str, limit: int | None) -> dict[str, object]:
    manifest = read_manifest(locations.model_dir(model))
    sentences = read_split(locations.data_root / manifest.data["folder"], "test", limit)
    program = load_graph_set(locations.graph_set_folder(model, "onnx")).program
    failed: list[str] = []
    no_entity = 0
    started = time.monotonic()
    for sentence in sentences:
        try:
            no_entity += not program.predict([list(sentence.tokens)])[0]
        except Exception as error:  # any failure counts; onnxruntime raises its own exception types
            failed.append(f"{' '.join(sentence.tokens)[:80]}: {str(error).splitlines()[0][:160]}")
    return {
        "model": model,
        "onnxruntime": onnxruntime.__version__,
        "sentences": len(sentences),
        "failed": len(failed),
        "no_entity": no_entity,
        "first_failed": failed[:3],
        "seconds": round(time.monotonic() - started, 1),
    }


@app.command()
def main(
    models: Annotated[str, typer.Option(help="comma-separated model names (exported to ONNX first)")],
    limit: Annotated[int | None, typer.Option(help="the first N test sentences only")] = None,
) -> None:
    locations = Locations()
    for model in models.split(","):
        print(json.dumps(lone_sentences(locations, model, limit)), flush=True)


if __name__ == "__main__":
    app()
