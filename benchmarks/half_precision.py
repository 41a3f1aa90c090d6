"""Half precision against fp32, on one device, per model: the share of test sentences whose entity
set is identical, both test F1s, and both programs' offline sentences/s (length-sorted batches).
The half-precision program is the one `--precision fp16|bf16` serves: the model's weights
converted once at load (eager), or its ONNX graphs compiled by OpenVINO in bf16 (`--runtime
openvino`, on the CPU, against OpenVINO's fp32). The gate for serving it: identical on >= 99.5 % of
sentences, F1 within 0.002.

    python benchmarks/half_precision.py --models span-conll03,setgen-conll03 --device cuda --precision fp16
    python benchmarks/half_precision.py --models span-conll03 --runtime openvino --device cpu --precision bf16 --threads 1
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from nerserve.ner.data import read_split
from nerserve.ner.evaluation import evaluate
from nerserve.ner.graph_format import EXPORT_JSON, GraphFormat, Runtime
from nerserve.ner.loading import load_model
from nerserve.ner.model_store import Locations
from nerserve.ner.runner import predict_all
from nerserve.ner.runtime.graph_set import load_graph_set

LOCATIONS = Locations()
SENTENCES_IDENTICAL, F1_WITHIN = 0.995, 0.002

app = typer.Typer(add_completion=False)


def programs(model: str, runtime: Runtime, device: str, precision: str, threads: int | None) -> tuple[Any, Any]:
    """The model's fp32 program and its PRECISION one, as RUNTIME serves them."""
    if runtime == Runtime.eager:
        full = load_model(LOCATIONS.model_dir(model), device, merged=True).program
        return full, load_model(LOCATIONS.model_dir(model), device, precision=precision, merged=True).program
    folder = LOCATIONS.graph_set_folder(model, GraphFormat.onnx.value)
    if not (folder / EXPORT_JSON).is_file():
        from nerserve.export.build import export_model

        export_model(LOCATIONS.model_dir(model), GraphFormat.onnx, LOCATIONS.graph_cache, LOCATIONS.data_root)
    return tuple(load_graph_set(folder, device, threads, runtime=runtime, precision=p).program for p in ("fp32", precision))


def compare(
    model: str,
    data: Path,
    runtime: Runtime,
    device: str,
    precision: str,
    batch_size: int,
    limit: int | None,
    threads: int | None,
) -> dict[str, Any]:
    full_program, half = programs(model, runtime, device, precision, threads)
    sentences = read_split(data, "test", limit)
    predict_all(full_program.predict, sentences[:batch_size], batch_size)  # warm-up of both
    predict_all(half.predict, sentences[:batch_size], batch_size)
    full, full_seconds = predict_all(full_program.predict, sentences, batch_size)
    reduced, reduced_seconds = predict_all(half.predict, sentences, batch_size)
    identical = sum(a == b for a, b in zip(full, reduced, strict=True)) / len(sentences)
    f1_full = float(evaluate((s.entities, p) for s, p in zip(sentences, full, strict=True))["f1"])  # type: ignore[arg-type]
    f1_half = float(evaluate((s.entities, p) for s, p in zip(sentences, reduced, strict=True))["f1"])  # type: ignore[arg-type]
    return {
        "model": model,
        "runtime": runtime.value,
        "precision": precision,
        "sentences": len(sentences),
        "identical_entity_sets": round(identical, 5),
        "f1_fp32": round(f1_full, 5),
        f"f1_{precision}": round(f1_half, 5),
        "f1_difference": round(f1_half - f1_full, 5),
        "sentences_per_second_fp32": round(len(sentences) / full_seconds, 1),
        f"sentences_per_second_{precision}": round(len(sentences) / reduced_seconds, 1),
        "passes": identical >= SENTENCES_IDENTICAL and abs(f1_half - f1_full) <= F1_WITHIN,
    }


@app.command()
def main(
    models: Annotated[str, typer.Option(help="comma-separated model names")] = "span-conll03",
    data: Annotated[Path, typer.Option()] = Path("../shared/data/conll03"),
    runtime: Annotated[Runtime, typer.Option(help="eager (weights converted at load) or openvino (on the CPU)")] = (
        Runtime.eager
    ),
    device: Annotated[str, typer.Option()] = "cuda",
    precision: Annotated[str, typer.Option(help="fp16 or bf16")] = "fp16",
    batch_size: Annotated[int, typer.Option(min=1)] = 128,
    limit: Annotated[int | None, typer.Option(help="first N test sentences (default: all)")] = None,
    threads: Annotated[int | None, typer.Option(min=1, help="openvino: threads per graph (default: every core)")] = None,
) -> None:
    for model in models.split(","):
        typer.echo(json.dumps(compare(model, data, runtime, device, precision, batch_size, limit, threads)))


if __name__ == "__main__":
    app()
