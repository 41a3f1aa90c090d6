"""The `nerserve` command line: train, tune, eval, export, serve.

The composition root: it sits above `ner`, `export` and `service` and imports each stage lazily,
per command (serving never loads the training or export code). The architecture choice comes
from the registered specs.
"""

from __future__ import annotations

import inspect
import json
import os
from collections.abc import Callable
from dataclasses import replace
from enum import StrEnum
from functools import wraps
from pathlib import Path
from typing import Annotated, Any, TypeVar

# Plain one-line usage errors ("No such option: --x") rather than rich boxes: scripts parse them.
os.environ.setdefault("TYPER_USE_RICH", "0")

import typer

from nerserve.export.parity import PARITY_SENTENCES
from nerserve.ner.archs.registry import ARCHITECTURES
from nerserve.ner.graph_format import GraphFormat, Runtime
from nerserve.ner.model_store import Locations

app = typer.Typer(add_completion=False, no_args_is_help=True, help="nerserve: NER models, training, evaluation, serving.")
F = TypeVar("F", bound=Callable[..., Any])
Architecture = StrEnum("Architecture", [(name, name) for name in ARCHITECTURES])  # type: ignore[misc]


class Split(StrEnum):
    train = "train"
    dev = "dev"
    test = "test"


class Precision(StrEnum):
    fp32 = "fp32"
    bf16 = "bf16"


def _user_errors(function: F) -> F:
    """Known failures (bad data, unknown model, bad backbone, bad weights) end in one line on
    stderr and exit code 2, never a traceback."""

    @wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from nerserve.ner.backbone import BackboneError
        from nerserve.ner.data import DataError
        from nerserve.ner.graph import GraphError
        from nerserve.ner.model_store import ModelStoreError

        known: tuple[type[Exception], ...] = (DataError, ModelStoreError, BackboneError, GraphError, FileNotFoundError)
        try:
            from nerserve.ner.lora import WeightsError

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


def _locations(context: typer.Context) -> Locations:
    """The folders the command works in: the root's flags (`nerserve --model-store D COMMAND`), else
    their NERSERVE_* variables, else the defaults (model_store/, build/graphs, ../shared/data)."""
    return Locations(**_given(context.find_root().params))


def _given(values: dict[str, Any]) -> dict[str, Any]:
    """Flags given (or read from their variables), as settings take them."""
    return {k: v.value if isinstance(v, StrEnum) else v for k, v in values.items() if v is not None}


def _print_version(asked: bool) -> None:
    if asked:
        from nerserve import __version__

        typer.echo(f"nerserve {__version__}")
        raise typer.Exit()


def main(**given: Any) -> None:
    """nerserve: NER models, training, evaluation, serving."""


@app.command()
@_user_errors
def train(
    context: typer.Context,
    architecture: Annotated[Architecture, typer.Argument(help="architecture to train")],
    data: DataOption,
    out: Annotated[Path, typer.Option("--out", help="model folder to write (model_store/NAME)")],
    epochs: Annotated[int, typer.Option(min=1)] = 5,
    batch_size: Annotated[int, typer.Option(min=1)] = 16,
    lr_lora: Annotated[float, typer.Option(min=0.0)] = 8e-4,
    lr_heads: Annotated[float, typer.Option(min=0.0)] = 1e-3,
    lora_rank: Annotated[int, typer.Option(min=1)] = 16,
    seed: int = 47,
    max_width: Annotated[int | None, typer.Option(min=1, help="longest seed span; default covers 99.5% of entities")] = None,
    train_limit: Annotated[int | None, typer.Option(min=1, help="use only the first N training sentences")] = None,
    dev_limit: Annotated[int | None, typer.Option(min=1)] = None,
    time_budget_minutes: Annotated[
        float | None, typer.Option(min=0.0, help="minutes of epochs: the epoch count and LR decay are fitted to it")
    ] = None,
    precision: Annotated[Precision, typer.Option(help="training steps in fp32 or under bf16 autocast")] = Precision.fp32,
    backbone: Annotated[str | None, typer.Option(help="package name or local HF folder")] = None,
    device: Annotated[str | None, typer.Option(help="cpu or cuda (default: cuda when present)")] = None,
    init_from: Annotated[
        str | None,
        typer.Option(help="trained model whose encoder starts this one (any architecture; all of it when the same)"),
    ] = None,
    scored_share: Annotated[
        float,
        typer.Option(min=0.0, max=1.0, help="gner: share of each epoch drawn from DATA, the rest evenly from open/"),
    ] = 0.4,
    held_out: Annotated[
        str | None, typer.Option(help="gliner: comma-separated sets beside DATA (or in open/) left out of training")
    ] = None,
    renamed_share: Annotated[
        float,
        typer.Option(min=0.0, max=1.0, help="gliner: chance that an asked name is swapped for a synonym or paraphrase"),
    ] = 0.3,
    wordnet_share: Annotated[
        float,
        typer.Option(
            min=0.0, max=1.0, help="gliner: chance that an asked name is swapped for a WordNet sub-type of its mentions"
        ),
    ] = 0.0,
    common_noun_share: Annotated[
        float,
        typer.Option(
            min=0.0, max=1.0, help="gliner: chance that an example asks for WordNet kinds of its common nouns instead"
        ),
    ] = 0.0,
    lowercase_share: Annotated[
        float,
        typer.Option(min=0.0, max=1.0, help="gliner: chance that an example's words are all lowercased (as queries are typed)"),
    ] = 0.0,
    focal_gamma: Annotated[
        float, typer.Option(min=0.0, help="gliner: focal loss's gamma; 0 is plain binary cross-entropy")
    ] = 0.0,
    focal_alpha: Annotated[
        float | None,
        typer.Option(min=0.0, max=1.0, help="gliner: weight of a positive (span, label) pair, 1 - it a negative's"),
    ] = None,
) -> None:
    """Train a model on DATA and write it (manifest + weights) to OUT; resumes from OUT/checkpoint."""
    from nerserve.ner.training.loop import TrainSettings

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
        precision=precision.value,
        init_from=_locations(context).model_dir(init_from) if init_from else None,
        scored_share=scored_share,
        held_out=held_out,
        renamed_share=renamed_share,
        wordnet_share=wordnet_share,
        common_noun_share=common_noun_share,
        lowercase_share=lowercase_share,
        focal_gamma=focal_gamma,
        focal_alpha=focal_alpha,
    )
    from nerserve.ner.loading import lazy

    trainer = lazy(ARCHITECTURES[architecture.value].trainer)
    manifest = trainer(data, out, settings, backbone, device)
    typer.echo(json.dumps(manifest.scores, indent=2))


@app.command()
@_user_errors
def tune(
    context: typer.Context,
    name: Annotated[str, typer.Argument(help="model folder under model_store/, or a path")],
    data: DataOption,
) -> None:
    """Re-choose a trained model's decoding options on dev and rewrite its manifest (test re-scored);
    an open-label gliner model's threshold on its selection sets (DATA: any set of the data root)."""
    from nerserve.ner.model_store import read_manifest

    folder = _locations(context).model_dir(name)
    if read_manifest(folder).architecture == "gliner":
        from nerserve.ner.training.gliner_trainer import retune_gliner

        typer.echo(json.dumps(retune_gliner(folder, data.parent), indent=2))
        return
    from nerserve.ner.training.decode_tuning import retune_model

    typer.echo(json.dumps(retune_model(folder, data), indent=2))


@app.command()
@_user_errors
def average(
    context: typer.Context,
    first: Annotated[str, typer.Argument(help="the later run: its manifest (config, history) is kept")],
    second: Annotated[str, typer.Argument(help="the run to average it with (same architecture, labels, adapters)")],
    out: Annotated[Path, typer.Option("--out", help="model folder to write")],
    # the range is checked once, by average_models (strictly between 0 and 1: an end is a copy, not an average)
    weight: Annotated[float, typer.Option(help="share of FIRST in the average, strictly between 0 and 1")] = 0.5,
) -> None:
    """Average two trained runs of one model (LoRA deltas averaged, cut back to rank by SVD); then
    `nerserve tune OUT --data SET` chooses its decoding on dev and scores it."""
    from nerserve.ner.training.weight_average import average_models

    locations = _locations(context)
    manifest = average_models(locations.model_dir(first), locations.model_dir(second), out, weight)
    typer.echo(json.dumps({"out": str(out), "version": manifest.version, **manifest.training["weight_average"]}))


@app.command("import-seq2seq")
@_user_errors
def import_seq2seq_command(
    folder: Annotated[Path, typer.Argument(help="a Hugging Face T5-family folder (GNER-T5, Flan-T5) with tokenizer.json")],
    out: Annotated[Path, typer.Option("--out", help="model folder to write (model_store/NAME)")],
    labels: Annotated[str, typer.Option(help="comma-separated label names /models lists (requests bring their own)")] = (
        "person,location,organization,miscellaneous"
    ),
) -> None:
    """Serve a seq2seq folder as an open-label gner model (GNER's prompt, free generation + LCS)."""
    from nerserve.ner.training.gner_trainer import import_seq2seq

    manifest = import_seq2seq(folder, out, [label.strip() for label in labels.split(",") if label.strip()])
    typer.echo(f"{out}: gner model over {manifest.backbone.name} ({manifest.config['decoder_layers']} decoder layers)")


@app.command("eval")
@_user_errors
def evaluate_model(
    context: typer.Context,
    name: Annotated[str, typer.Argument(help="model folder under model_store/, or a path")],
    data: DataOption,
    split: Split = Split.test,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
    runtime: Annotated[Runtime, typer.Option(help="eager torch, or the exported graphs (exported first if missing)")] = (
        Runtime.eager
    ),
    int8: Annotated[bool, typer.Option("--int8", help="with --runtime onnx: the INT8-quantised graphs")] = False,
    precision: Annotated[
        Precision, typer.Option(help="with --runtime openvino: the graphs computed in fp32 or bf16")
    ] = Precision.fp32,
    batch_size: Annotated[int, typer.Option(min=1)] = 32,
    limit: Annotated[int | None, typer.Option(min=1, help="first N sentences only")] = None,
    threshold: Annotated[float | None, typer.Option(min=0.0, max=1.0, help="override the manifest's δ")] = None,
    device: Annotated[str | None, typer.Option()] = None,
    threads: Annotated[
        int | None, typer.Option(min=1, help="intra-op threads (torch and each graph; default: every core)")
    ] = None,
) -> None:
    """Strict P/R/F1 of a trained model on a split, with by-type, nested and discontinuous breakdowns."""
    import torch

    from nerserve.ner.archs.registry import architecture
    from nerserve.ner.data import named_split, read_split
    from nerserve.ner.loading import load_model
    from nerserve.ner.model_store import read_manifest
    from nerserve.ner.runner import score

    if int8 and runtime != Runtime.onnx:
        raise typer.BadParameter("--int8 needs --runtime onnx", param_hint="--int8")
    if precision != Precision.fp32 and runtime != Runtime.openvino:
        raise typer.BadParameter("--precision bf16 needs --runtime openvino", param_hint="--precision")
    # the data first: a bad file is reported before a model is loaded; an open-label model is
    # asked the data's own label names
    locations = _locations(context)
    folder = locations.model_dir(name)
    open_labels = architecture(read_manifest(folder).architecture).capabilities.open_labels
    if open_labels:
        sentences, labels = named_split(data, split.value, limit)
    else:
        sentences = read_split(data, split.value, limit)
    if threads:
        torch.set_num_threads(threads)
    if runtime == Runtime.eager:
        program = load_model(folder, device).program
    else:
        program = _exported_program(locations, folder, runtime, int8, device, threads, precision.value)
    options = program.config.decode
    if open_labels:
        options = replace(options, labels=labels)
    if threshold is not None:
        options = replace(options, threshold=threshold)
    report = score(lambda batch: program.predict(batch, options), sentences, batch_size, progress=not as_json)
    if program.outcomes:  # generative decoders: how sequences ended, drops included
        report["decoder_outcomes"] = dict(program.outcomes)
    report = {
        "model": name,
        "split": split.value,
        "runtime": runtime.value + ("-int8" if int8 else "") + (f"-{precision.value}" if precision != Precision.fp32 else ""),
        "threshold": getattr(options, "threshold", None),
        **({"labels": list(options.labels)} if hasattr(options, "labels") else {}),
        "threads": torch.get_num_threads(),
        **report,
    }
    if as_json:
        typer.echo(json.dumps(report))
        return
    typer.echo(f"{name} ({report['runtime']}) on {data}/{split.value}: {report['sentences']} sentences")
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
    for part, errors in report["errors"].items():
        if errors:
            typer.echo(f"  {part.replace('_', ' ')}: " + ", ".join(f"{kind} {n}" for kind, n in errors.items()))


def _exported_program(
    locations: Locations,
    source: Path,
    runtime: Runtime,
    int8: bool,
    device: str | None,
    threads: int | None,
    precision: str = "fp32",
) -> Any:
    """The program over a ready graph set of the model in SOURCE, exporting it first when there is none."""
    from nerserve.ner.graph_format import EXPORT_JSON
    from nerserve.ner.runtime.graph_set import load_graph_set

    fmt = runtime.graph_format or GraphFormat.onnx
    folder = locations.graph_set_folder(source, fmt.value, int8)
    if not (folder / EXPORT_JSON).is_file():
        from nerserve.export.build import export_model

        graph_cache, data_root = locations.graph_cache, locations.data_root
        export_model(source, fmt, graph_cache, data_root, int8, log=lambda m: typer.echo(m, err=True))
    return load_graph_set(folder, device or "cpu", threads, runtime=runtime, precision=precision).program


@app.command("export")
@_user_errors
def export_command(
    context: typer.Context,
    name: Annotated[str, typer.Argument(help="model folder under model_store/, or a path")],
    format: Annotated[GraphFormat, typer.Option("--format", help="graph format")] = GraphFormat.onnx,
    int8: Annotated[bool, typer.Option("--int8", help="ONNX Runtime dynamic INT8 quantisation (CPU)")] = False,
    force: Annotated[bool, typer.Option("--force", help="export even when the source is unchanged")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print export.json (with parity figures)")] = False,
    parity_sentences: Annotated[
        int, typer.Option(min=17, help="dev sentences the parity check runs (the service's first start uses 32)")
    ] = PARITY_SENTENCES,
    padded_backbone: Annotated[
        bool,
        typer.Option(
            "--padded-backbone",
            help="ONNX graphs whose backbone runs its rows' padding too, as eager torch on a GPU does, written "
            "beside the service's (onnx-padded-…), which it does not load: for measuring on a device what "
            "skipping the padding, the CPU's choice, costs there (benchmarks/onnx_profile.py --padded-backbone)",
        ),
    ] = False,
) -> None:
    """Merge LoRA, write the graphs + tokenizer + export.json, and check parity against eager torch."""
    from nerserve.export.build import export_model

    if int8 and format != GraphFormat.onnx:
        raise typer.BadParameter("--int8 needs --format onnx", param_hint="--int8")
    if padded_backbone and (int8 or format != GraphFormat.onnx):
        raise typer.BadParameter("--padded-backbone is for fp32 ONNX graphs", param_hint="--padded-backbone")
    locations = _locations(context)
    info = export_model(
        locations.model_dir(name),
        format,
        locations.graph_cache,
        locations.data_root,
        int8,
        force=force,
        log=lambda m: typer.echo(m, err=True),
        parity_sentences=parity_sentences,
        padded_backbone=padded_backbone,
    )
    if as_json:
        typer.echo(json.dumps(info))
    elif not info["ready"]:
        raise typer.Exit(1)


def _flag_type(annotation: Any) -> tuple[Any, dict[str, Any]]:
    """A settings field's type as a command-line flag takes it: optional unwrapped, a list as a
    comma-separated string (the settings split it), a Literal as a choice."""
    import types
    import typing

    arguments = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(arguments) == 1:
        annotation = arguments[0]
    if typing.get_origin(annotation) is list:
        return str, {}
    if typing.get_origin(annotation) is typing.Literal:
        choices = [str(a) for a in typing.get_args(annotation)]
        return StrEnum("Choice", [(c, c) for c in choices]), {}  # type: ignore[misc]
    if getattr(annotation, "__name__", "") == "SecretStr":
        return str, {}
    return annotation, {}


def _settings_flags(model: Any, exclude: frozenset[str]) -> list[inspect.Parameter]:
    """One option per field of a pydantic-settings model: its name as the flag, its description as
    the help, its environment variable shown (and read by the settings themselves); None = unset."""
    prefix = model.model_config.get("env_prefix", "")
    flags = []
    for name, field in model.model_fields.items():
        if name in exclude:
            continue
        kind, extra = _flag_type(field.annotation)
        flag = name.replace("_", "-")
        default = field.get_default(call_default_factory=True)
        shown = ",".join(default) if isinstance(default, list) else getattr(default, "value", default)
        option = typer.Option(
            f"--{flag}/--no-{flag}" if kind is bool else f"--{flag}",
            help=field.description or "",
            envvar=f"{prefix}{name.upper()}",
            show_envvar=True,
            show_default=False if shown in (None, "") else str(shown),
            **extra,
        )
        annotation = Annotated[kind | None, option]  # type: ignore[valid-type]
        flags.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=annotation))
    return flags


# never flags: a key on the command line is visible to everyone who can run `ps`
SECRET_SETTINGS = frozenset({"api_keys"})


def _serve_settings(context: typer.Context, given: dict[str, Any]) -> Any:
    """The server's settings: the folders given before the command, overridden by the flags after
    it, over NERSERVE_* and the defaults; a bad value ends in one line naming its flag."""
    from pydantic import ValidationError

    from nerserve.service.config import Settings

    try:
        return Settings(**{**_given(context.find_root().params), **_given(given)})
    except ValidationError as error:
        first = error.errors()[0]
        where = "--" + "-".join(str(p) for p in first["loc"]).replace("_", "-") if first["loc"] else "settings"
        typer.echo(f"error: {where}: {first['msg']}", err=True)
        raise typer.Exit(2) from None


def serve(context: typer.Context, **given: Any) -> None:
    """Serve models over HTTP (POST /extract). Every flag is also an environment variable NERSERVE_<FLAG>."""
    from nerserve.compose import START_UP_EXPORTER
    from nerserve.service.server import run

    settings = _serve_settings(context, given)
    run(settings, START_UP_EXPORTER)


CONTEXT = inspect.Parameter("context", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context)


def _register_root_and_serve() -> None:
    """The root's flags are the locations' (every command reads them), serve's the server's settings
    (the locations among them): each declared once, in its settings model."""
    from nerserve.service.config import Settings

    version = typer.Option("--version", is_eager=True, callback=_print_version, help="print the version and exit")
    asked = inspect.Parameter("version", inspect.Parameter.KEYWORD_ONLY, default=False, annotation=Annotated[bool, version])
    main.__signature__ = inspect.Signature([*_settings_flags(Locations, frozenset()), asked])  # type: ignore[attr-defined]
    app.callback()(main)
    serving = _settings_flags(Settings, SECRET_SETTINGS)
    serve.__signature__ = inspect.Signature([CONTEXT, *serving])  # type: ignore[attr-defined]
    app.command("serve")(serve)
    own = [p for p in inspect.signature(serve_ray, eval_str=True).parameters.values() if p.kind != p.VAR_KEYWORD]
    serve_ray.__signature__ = inspect.Signature([*own, *serving])  # type: ignore[attr-defined]
    app.command("serve-ray")(serve_ray)


def serve_ray(
    context: typer.Context,
    replicas: Annotated[int | None, typer.Option(min=1, help="replicas (fixed; the first count when autoscaling)")] = None,
    max_replicas: Annotated[int | None, typer.Option(min=1, help="autoscale up to this many on requests in flight")] = None,
    min_replicas: Annotated[int, typer.Option(min=0, help="autoscale down to this many")] = 1,
    target_in_flight: Annotated[float, typer.Option(min=0.1, help="autoscaling: requests in flight per replica")] = 16.0,
    address: Annotated[
        str | None, typer.Option(help="an existing Ray cluster (ray://host:10001 or auto); default: a local one")
    ] = None,
    cpus_per_replica: Annotated[float, typer.Option(min=0.0, help="CPUs Ray reserves for each replica")] = 1.0,
    **given: Any,
) -> None:
    """Serve the same app on Ray Serve, N replicas (each its own models and batcher) behind Ray's
    proxy; every response says which replica answered (X-Replica). Every serve setting applies to
    each replica (as a flag or NERSERVE_*)."""
    from nerserve.compose import START_UP_EXPORTER
    from nerserve.service.ray_app import run_on_ray

    settings = _serve_settings(context, given)
    scale = {"replicas": replicas, "min_replicas": min_replicas, "max_replicas": max_replicas}
    run_on_ray(settings, START_UP_EXPORTER, address, cpus_per_replica, target_in_flight=target_in_flight, **scale)


_register_root_and_serve()
