"""The `nerserve` command line: train, eval (export and serve join as their stages land)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from enum import StrEnum
from functools import wraps
from pathlib import Path
from typing import Annotated, Any, TypeVar

# Plain one-line usage errors ("No such option: --x") rather than rich boxes: scripts parse them.
os.environ.setdefault("TYPER_USE_RICH", "0")

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True, help="nerserve: NER models, training, evaluation.")
F = TypeVar("F", bound=Callable[..., Any])


class Architecture(StrEnum):
    span = "span"


class Split(StrEnum):
    train = "train"
    dev = "dev"
    test = "test"


class Runtime(StrEnum):
    eager = "eager"


def _user_errors(function: F) -> F:
    """Known failures (bad data, unknown model, bad backbone, bad weights) end in one line on
    stderr and exit code 2, never a traceback."""

    @wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from ner.backbone import BackboneError
        from ner.data import DataError
        from ner.model_store import ModelStoreError

        known: tuple[type[Exception], ...] = (DataError, ModelStoreError, BackboneError, FileNotFoundError)
        try:
            from ner.lora import WeightsError

            known += (WeightsError,)
        except ImportError:  # pragma: no cover - torch missing entirely
            pass
        try:
            return function(*args, **kwargs)
        except known as error:
            typer.echo(f"error: {error}", err=True)
            raise typer.Exit(2) from None

    return wrapper  # type: ignore[return-value]


DataOption = Annotated[Path, typer.Option("--data", help="dataset folder with train/dev/test.jsonl")]


@app.command()
@_user_errors
def train(
    architecture: Annotated[Architecture, typer.Argument(help="architecture to train")],
    data: DataOption,
    out: Annotated[Path, typer.Option("--out", help="model folder to write (model_store/NAME)")],
    epochs: Annotated[int, typer.Option(min=1)] = 5,
    batch_size: Annotated[int, typer.Option(min=1)] = 16,
    lr_lora: Annotated[float, typer.Option(min=0.0)] = 8e-4,
    lr_heads: Annotated[float, typer.Option(min=0.0)] = 1e-3,
    lora_rank: Annotated[int, typer.Option(min=1)] = 16,
    seed: int = 47,
    max_width: Annotated[
        int | None, typer.Option(min=1, help="longest seed span; default covers 99.5% of entities")
    ] = None,
    train_limit: Annotated[int | None, typer.Option(min=1, help="use only the first N training sentences")] = None,
    dev_limit: Annotated[int | None, typer.Option(min=1)] = None,
    time_budget_minutes: Annotated[float | None, typer.Option(min=0.0, help="stop after the epoch crossing it")] = None,
    backbone: Annotated[str | None, typer.Option(help="package name or local HF folder")] = None,
    device: Annotated[str | None, typer.Option(help="cpu or cuda (default: cuda when present)")] = None,
) -> None:
    """Train a model on DATA and write it (manifest + weights) to OUT; resumes from OUT/checkpoint."""
    from ner.training.span_trainer import TrainSettings, train_span

    settings = TrainSettings(
        epochs=epochs,
        batch_size=batch_size,
        lr_lora=lr_lora,
        lr_heads=lr_heads,
        lora_rank=lora_rank,
        seed=seed,
        max_width=max_width,
        train_limit=train_limit,
        dev_limit=dev_limit,
        time_budget_minutes=time_budget_minutes,
    )
    manifest = train_span(data, out, settings, backbone, device)
    typer.echo(json.dumps(manifest.scores, indent=2))


@app.command("eval")
@_user_errors
def evaluate_model(
    name: Annotated[str, typer.Argument(help="model folder under model_store/, or a path")],
    data: DataOption,
    split: Split = Split.test,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
    runtime: Runtime = Runtime.eager,
    batch_size: Annotated[int, typer.Option(min=1)] = 32,
    limit: Annotated[int | None, typer.Option(min=1, help="first N sentences only")] = None,
    threshold: Annotated[float | None, typer.Option(min=0.0, max=1.0, help="override the manifest's δ")] = None,
    device: Annotated[str | None, typer.Option()] = None,
) -> None:
    """Strict P/R/F1 of a trained model on a split, with by-type, nested and discontinuous breakdowns."""
    import torch

    from ner.data import read_split
    from ner.loading import load_model
    from ner.runner import score

    sentences = read_split(data, split.value, limit)
    model = load_model(name, device)
    options = model.program.config.decode
    if threshold is not None:
        options = options.replace(threshold=threshold)
    report = score(lambda batch: model.program.predict(batch, options), sentences, batch_size, progress=not as_json)
    report = {
        "model": model.manifest.name,
        "split": split.value,
        "runtime": runtime.value,
        "threshold": options.threshold,
        "threads": torch.get_num_threads(),
        **report,
    }
    if as_json:
        typer.echo(json.dumps(report))
        return
    typer.echo(f"{model.manifest.name} on {data}/{split.value}: {report['sentences']} sentences")
    typer.echo(
        f"  P {report['precision']:.4f}  R {report['recall']:.4f}  F1 {report['f1']:.4f}  "
        f"({report['sentences_per_second']:.1f} sentences/s)"
    )
    for label, counts in report["by_type"].items():
        typer.echo(f"  {label:>12}  F1 {counts['f1']:.4f}  gold {counts['gold']}")
    for part in ("nested", "discontinuous"):
        counts = report[part]
        if counts["gold"] or counts["predicted"]:
            typer.echo(f"  {part:>12}  F1 {counts['f1']:.4f}  gold {counts['gold']}")
