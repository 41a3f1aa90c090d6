"""The backbone replayed from CUDA graphs (`--cuda-graphs`) against the plain eager program, on one
GPU, per model, both in one precision: the share of test sentences whose entity set is identical, both test F1s, both
programs' offline sentences/s (batches of similar lengths) at small batch sizes (where launches, not kernels, take the time),
each program's load time (the captures are made at load) and the GPU memory each holds after it.
Padding to a bucket changes no sentence's states beyond float noise, so the entity sets should be
identical nearly everywhere; the gate used: >= 99.9 % identical, F1 within 0.001.

    python benchmarks/cuda_graphs_check.py --models span-conll03,setgen-conll03 --device cuda [--traced-heads|--compiled-heads]
    python benchmarks/cuda_graphs_check.py --models span-conll03 --device cpu --compiled-heads  # the compiled heads alone
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from nerserve.ner.data import read_split
from nerserve.ner.evaluation import evaluate
from nerserve.ner.loading import load_model
from nerserve.ner.model_store import Locations, read_manifest
from nerserve.ner.runner import predict_all

LOCATIONS = Locations()
SENTENCES_IDENTICAL, F1_WITHIN = 0.999, 0.001
# the plain program on the device against the test F1 its manifest records (measured where it was
# trained, on the CPU): within this, the device's eager path answers as the trained model does
MANIFEST_F1_WITHIN = 0.002

app = typer.Typer(add_completion=False)


def loaded(
    model: str, device: str, precision: str, cuda_graphs: bool, traced_heads: bool = False, compiled_heads: bool = False
) -> tuple[Any, float, float]:
    """→ the program, its load seconds, and the GPU memory torch holds once it is loaded (MiB)."""
    import torch

    started = time.perf_counter()
    folder = LOCATIONS.model_dir(model)
    on_cuda = device.startswith("cuda")
    program = load_model(
        folder,
        device,
        precision=precision,
        merged=True,
        cuda_graphs=cuda_graphs and on_cuda,
        traced_heads=traced_heads,
        compiled_heads=compiled_heads,
    ).program
    if not on_cuda:  # the traced or compiled heads alone (--traced-heads, --compiled-heads on the CPU)
        return program, time.perf_counter() - started, 0.0
    torch.cuda.synchronize(device)
    return program, time.perf_counter() - started, torch.cuda.memory_reserved(device) / 2**20


def compare(
    model: str,
    data: Path,
    device: str,
    precision: str,
    batch_size: int,
    sizes: list[int],
    timed: int,
    traced_heads: bool = False,
    compiled_heads: bool = False,
) -> dict[str, Any]:
    plain, plain_load, plain_mib = loaded(model, device, precision, False)
    replayed, replayed_load, replayed_mib = loaded(model, device, precision, True, traced_heads, compiled_heads)
    sentences = read_split(data, "test")
    by_length = sorted(sentences, key=lambda s: len(s.tokens))
    for program in (plain, replayed):  # warm-up of both at every size timed
        for size in sizes:
            predict_all(program.predict, by_length[:size], size)
    found_plain, _ = predict_all(plain.predict, sentences, batch_size)
    found_replayed, _ = predict_all(replayed.predict, sentences, batch_size)
    identical = sum(a == b for a, b in zip(found_plain, found_replayed, strict=True)) / len(sentences)
    f1_plain = float(evaluate((s.entities, p) for s, p in zip(sentences, found_plain, strict=True))["f1"])  # type: ignore[arg-type]
    f1_replayed = float(evaluate((s.entities, p) for s, p in zip(sentences, found_replayed, strict=True))["f1"])  # type: ignore[arg-type]
    manifest_f1 = float(read_manifest(LOCATIONS.model_dir(model)).scores["test"]["f1"])
    rows = []
    for size in sizes:
        sample = sentences[: max(timed, size)]
        rows.append(
            {
                "batch_size": size,
                "plain": round(len(sample) / predict_all(plain.predict, sample, size)[1], 1),
                "cuda_graphs": round(len(sample) / predict_all(replayed.predict, sample, size)[1], 1),
            }
        )
    return {
        "model": model,
        "device": device,
        "precision": precision,
        "traced_heads": traced_heads,  # the replayed program's: all but the backbone traced at load
        "compiled_heads": compiled_heads,  # or compiled
        "sentences": len(sentences),
        "identical_entity_sets": round(identical, 5),
        "f1_plain": round(f1_plain, 5),
        "f1_cuda_graphs": round(f1_replayed, 5),
        "f1_manifest": round(manifest_f1, 5),
        "plain_matches_manifest": abs(f1_plain - manifest_f1) <= MANIFEST_F1_WITHIN,
        "load_seconds": {"plain": round(plain_load, 2), "cuda_graphs": round(replayed_load, 2)},
        # what torch reserved for each model as it loaded (the replayed one's: weights and graph pools)
        "gpu_reserved_mib": {"plain": round(plain_mib), "cuda_graphs": round(replayed_mib - plain_mib)},
        "sentences_per_second": rows,  # predict_all's batches, of similar lengths
        "passes": identical >= SENTENCES_IDENTICAL and abs(f1_replayed - f1_plain) <= F1_WITHIN,
    }


@app.command()
def main(
    models: Annotated[str, typer.Option(help="comma-separated model names")] = "span-conll03",
    data: Annotated[Path, typer.Option()] = Path("../shared/data/conll03"),
    device: Annotated[str, typer.Option(help="a CUDA device: a capture needs one")] = "cuda",
    precision: Annotated[str, typer.Option(help="both programs' precision: fp32, or fp16/bf16 (converted at load)")] = "fp32",
    batch_size: Annotated[int, typer.Option(min=1, help="batch size of the entity-set comparison")] = 64,
    sizes: Annotated[str, typer.Option(help="comma-separated batch sizes timed")] = "1,8,32,128",
    timed: Annotated[int, typer.Option(min=1, help="sentences timed at each size")] = 512,
    traced_heads: Annotated[
        bool, typer.Option(help="the replayed program with all but the backbone traced too (serve's --traced-heads)")
    ] = False,
    compiled_heads: Annotated[
        bool,
        typer.Option(help="the replayed program with all but the backbone and the BiLSTM compiled (serve's --compiled-heads)"),
    ] = False,
) -> None:
    if not device.startswith("cuda") and not (traced_heads or compiled_heads):
        raise typer.BadParameter(
            f"{device}: CUDA graphs need a CUDA device (elsewhere: --traced-heads or --compiled-heads alone)",
            param_hint="--device",
        )
    for model in models.split(","):
        sized = [int(n) for n in sizes.split(",")]
        report = compare(model, data, device, precision, batch_size, sized, timed, traced_heads, compiled_heads)
        typer.echo(json.dumps(report))


if __name__ == "__main__":
    app()
