"""`nerserve export NAME --format onnx|torchscript [--int8]`: merge LoRA, write the architecture's
graphs, the tokenizer and export.json, then check parity against eager torch on real dev sentences.
A graph set whose parity fails is written but not marked ready; the service refuses it."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import platform
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime
import torch

from nerserve.export.parity import (
    PARITY_SENTENCES,
    ParityReport,
    ReferenceRun,
    check_parity,
    parity_batches,
    reference_runs,
)
from nerserve.export.session_tuning import lower_level_candidates, tune_graphs
from nerserve.export.writers import OPSET, fuse_transformer, quantize_int8, write_onnx, write_torchscript
from nerserve.ner.data import read_split
from nerserve.ner.encoder import WordEncoder
from nerserve.ner.examples import CHECK_SENTENCES, EXAMPLE_SENTENCES
from nerserve.ner.graph_format import EXPORT_JSON, TOKENIZER_JSON, GraphFormat, graph_file
from nerserve.ner.loading import load_model
from nerserve.ner.lora import merge_adapters
from nerserve.ner.model_store import MANIFEST, WEIGHTS, Locations, graph_set_folder
from nerserve.ner.runtime.graph_set import load_graph_set
from nerserve.ner.text.subword import packed_rows


def example_values(program: Any) -> dict[str, np.ndarray]:
    """Every graph input and output for EXAMPLE_SENTENCES, with the encoder's rows packed two
    sentences in one row and one in another where the tokenizer's lengths allow (rows and row
    length sizes above 1 and apart from the sentences' own), else a sentence a row."""
    subwords = program.subwords
    counts = [t.subwords + subwords.special_count for t in subwords.tokenize(EXAMPLE_SENTENCES)]
    in_two = (c for c in range(max(counts), sum(counts) + 1) if len(packed_rows(counts, c)) == 2)
    packed_in_two = next(in_two, 0)
    saved, subwords.row_subwords = subwords.row_subwords, packed_in_two
    try:
        return dict(program.export_values(program.prepare(EXAMPLE_SENTENCES)))
    finally:
        subwords.row_subwords = saved


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _signature(names: tuple[str, ...], values: dict[str, np.ndarray], axes: Mapping[str, tuple[str, ...]]) -> list[Any]:
    return [
        {
            "name": n,
            "dtype": str(values[n].dtype),
            "axes": [a or int(values[n].shape[i]) for i, a in enumerate(axes[n])],
        }
        for n in names
    ]


def export_model(
    source: Path,
    fmt: GraphFormat,
    graph_cache: Path,
    data_root: Path,
    int8: bool = False,
    force: bool = False,
    log: Any = print,
    parity_sentences: int = PARITY_SENTENCES,
    on_staging: Callable[[Path], None] | None = None,
    time_every_core: bool = True,
    padded_backbone: bool = False,
) -> dict[str, Any]:
    """Export the trained model in folder SOURCE to a graph set under GRAPH_CACHE, its parity checked
    on dev sentences of its dataset under DATA_ROOT.

    INT8 quantises the graphs the architecture lists (`int8_graphs`: the encoder always, other
    graphs where quantising them paid for its cost in F1: docs/decisions/cpu-inference.md).
    `on_staging(path)` is told the staging folder as soon as it exists (a service that stops an
    export removes it when the export could not). `time_every_core`: time the graphs on every
    core too (session_tuning). `padded_backbone`: ONNX graphs whose backbone runs every position of
    its rows, padding included, as eager torch on a GPU does, rather than its real sub-words only
    (the CPU's choice, ner.unpadded: a `NonZero` whose count a device must hand to the host);
    written beside the service's graphs (graph_set_folder's `padded`), for measuring that choice
    on a device."""
    if int8 and fmt != GraphFormat.onnx:
        raise ValueError("--int8 is available for --format onnx only")
    if padded_backbone and (int8 or fmt != GraphFormat.onnx):
        raise ValueError("--padded-backbone is for fp32 ONNX graphs (TorchScript's backbone runs its padding anyway)")
    name = source.name
    target = graph_set_folder(source, fmt.value, graph_cache, int8, padded_backbone)
    if not force and (target / EXPORT_JSON).is_file():
        previous = json.loads((target / EXPORT_JSON).read_text())
        if previous.get("ready"):
            log(f"{name}: unchanged since the last export, skipped ({target})")
            return {**previous, "skipped": True, "folder": str(target)}
    started = time.perf_counter()
    model = load_model(source, device="cpu")
    spec = model.spec
    signatures = spec.signatures(model.network.config)
    int8_graphs = spec.int8_graphs if int8 else ()
    merged = merge_adapters(copy.deepcopy(model.network))
    # ONNX graphs are the CPU's: their backbone skips the rows' padding (ner.unpadded)
    skips_padding = fmt == GraphFormat.onnx and not padded_backbone
    encoders = [module for module in merged.modules() if isinstance(module, WordEncoder)] if skips_padding else []
    real_subwords_only = any([encoder.skip_padding() for encoder in encoders])  # a list: every encoder is told
    # graphs() may wrap the network's parts in new modules, which start in training mode
    modules = {graph_name: module.eval() for graph_name, module in merged.graphs().items()}

    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=target.parent))
    try:
        if on_staging is not None:
            on_staging(staging)
        # example inputs for every graph, from the eager program itself
        values = example_values(model.program)
        check_values = dict(model.program.export_values(model.program.prepare(CHECK_SENTENCES)))
        graphs_info: dict[str, Any] = {}
        fusions: dict[str, dict[str, int]] = {}
        exporters: dict[str, str] = {}
        for graph_name, signature in signatures.items():
            log(f"{name}: exporting graph {graph_name} ({fmt.value}{' int8' if int8 else ''})")
            args = tuple(torch.from_numpy(np.ascontiguousarray(values[n])) for n in signature.inputs)
            check = tuple(torch.from_numpy(np.ascontiguousarray(check_values[n])) for n in signature.inputs)
            path = graph_file(staging, graph_name, fmt)
            if fmt == GraphFormat.onnx:
                exporters[graph_name] = write_onnx(modules[graph_name], args, path, signature, check_args=check)
                if graph_name in spec.backbone_graphs:
                    fusions[graph_name] = fuse_transformer(path)
                if graph_name in int8_graphs:
                    fp32 = path.with_suffix(".fp32.onnx")
                    path.rename(fp32)
                    quantize_int8(fp32, path)
                    fp32.unlink()
            else:
                write_torchscript(modules[graph_name], args, path, signature)
            graphs_info[graph_name] = {
                "file": path.name,
                "sha256": _sha256(path),
                "bytes": path.stat().st_size,
                "inputs": _signature(signature.inputs, values, signature.axes),
                "outputs": _signature(signature.outputs, values, signature.axes),
            }
        onnx_session: dict[str, Any] = {}
        if fmt == GraphFormat.onnx:
            log(f"{name}: timing ONNX Runtime's optimisation levels")
            paths = {graph_name: graph_file(staging, graph_name, fmt) for graph_name in signatures}
            feeds = {graph_name: {n: values[n] for n in signature.inputs} for graph_name, signature in signatures.items()}
            onnx_session = tune_graphs(paths, feeds, every_core=time_every_core)
        shutil.copy(source / MANIFEST, staging / MANIFEST)
        model.program.subwords.tokenizer.save(str(staging / TOKENIZER_JSON))
        info: dict[str, Any] = {
            "model": source.name,
            "architecture": model.manifest.architecture,
            "format": fmt.value,
            "int8": int8,
            "int8_graphs": list(int8_graphs),
            "opset": OPSET if fmt == GraphFormat.onnx else None,
            "fusions": fusions,
            "backbone_on_real_subwords_only": real_subwords_only,
            "exporter": exporters if fmt == GraphFormat.onnx else "torch.jit.trace",
            "onnx_session": onnx_session,
            "versions": {
                "torch": torch.__version__,
                "onnxruntime": onnxruntime.__version__,
                "python": platform.python_version(),
            },
            "source": {
                "manifest_sha256": _sha256(source / MANIFEST),
                "weights_sha256": _sha256(source / WEIGHTS),
                "digest_folder": target.name,
            },
            "graphs": graphs_info,
            "ready": True,  # provisional, so that parity can load the set; rewritten below
        }
        _write_info(staging, info)

        log(f"{name}: parity against eager torch")
        exported = load_graph_set(staging, device="cpu").program
        data_dir = data_root / str(model.manifest.data.get("folder", ""))
        if (data_dir / "dev.jsonl").is_file():
            batches, parity_source = parity_batches(read_split(data_dir, "dev"), parity_sentences), str(data_dir / "dev.jsonl")
        else:
            # e.g. inside a container without the datasets: still check, on the built-in sentences
            log(f"{name}: {data_dir}/dev.jsonl not found; parity on built-in sentences only")
            batches = [EXAMPLE_SENTENCES, *([s] for s in EXAMPLE_SENTENCES), EXAMPLE_SENTENCES[::-1]]
            parity_source = "built-in example sentences (dataset not found)"
        runs = reference_runs(model.program, batches, exported)
        strict = spec.capabilities.autoregressive
        report = check_parity(exported, runs, strict_integers=strict)
        if fmt == GraphFormat.onnx and not int8 and not report.passed():
            report = _parity_at_lower_levels(name, staging, info, runs, report, strict, log)
        parity = {**report.to_dict(), "source": parity_source}
        if int8:
            # Quantised graphs are not meant to match fp32 to 1e-4: they are judged by their F1, and
            # served only where their entity sets mostly agree with fp32's (graph_format.int8_refusal).
            parity["mode"] = "int8: differences expected; judge by eval F1"
            info["ready"] = True
        else:
            parity["mode"] = "fp32"
            info["ready"] = report.passed()
        info["parity"] = parity
        info["seconds"] = round(time.perf_counter() - started, 1)
        _write_info(staging, info)
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    status = "ready" if info["ready"] else f"NOT ready (parity failed: {'; '.join(parity['misses'])})"
    identical = parity["entity_sets_identical"]
    log(f"{name}: {status}; max |Δ| {parity['max_abs_diff']:.2e}, entity sets identical: {identical}")
    return {**info, "skipped": False, "folder": str(target)}


def _write_info(folder: Path, info: dict[str, Any]) -> None:
    (folder / EXPORT_JSON).write_text(json.dumps(info, indent=2))


def _parity_at_lower_levels(
    name: str,
    staging: Path,
    info: dict[str, Any],
    runs: list[ReferenceRun],
    report: ParityReport,
    strict: bool,
    log: Any,
) -> ParityReport:
    """The exported set missed parity at its fastest ONNX Runtime levels: re-check it at lower
    levels (`lower_level_candidates`: the graphs that missed first, then all) and keep the first
    settings that pass (ONNX Runtime's fusions reorder floating-point sums, so fewer fusions can
    mean a closer match to torch). What the fastest levels gave is kept in export.json
    ("parity_at_fastest_levels"); with nothing passing, the last report is returned and the set
    stays not ready."""
    fastest = report
    for lowered, levels in lower_level_candidates(info["onnx_session"], _graphs_that_missed(info["graphs"], report)):
        log(f"{name}: parity missed ({'; '.join(report.misses())}); trying {lowered}")
        info["onnx_session"] = levels
        _write_info(staging, info)
        report = check_parity(load_graph_set(staging, device="cpu").program, runs, strict_integers=strict)
        if report.passed():
            break
    info["parity_at_fastest_levels"] = fastest.to_dict()
    return report


def _graphs_that_missed(graphs_info: Mapping[str, Any], report: ParityReport) -> set[str]:
    """The graphs with an output of their own out of tolerance. Empty when what missed is not any
    one graph's output (an entity set, a value the program computes from several steps)."""
    missed = report.outputs_out_of_tolerance()
    return {graph for graph, graph_info in graphs_info.items() if missed & {o["name"] for o in graph_info["outputs"]}}


def export_for_service(
    source: Path, fmt: str, int8: bool, locations: Locations, parity_sentences: int, background: bool, report: Any
) -> None:
    """A service's start-up export, in a process forked from its export server (which has torch,
    transformers and peft imported already, seconds a model otherwise). → `report` (a Connection):
    ("staging", its staging folder) once it exists, then ("done", None) when the graphs are ready,
    else ("done", why not)."""
    if background:  # another model already answers: keep its cores
        os.nice(10)
        torch.set_num_threads(1)
    try:
        info = export_model(
            source,
            GraphFormat(fmt),
            locations.graph_cache,
            locations.data_root,
            int8,
            parity_sentences=parity_sentences,
            log=lambda _: None,
            on_staging=lambda path: report.send(("staging", str(path))),
            time_every_core=not background,
        )
        reason = None if info["ready"] else f"parity failed: {'; '.join(info['parity']['misses'])}"
    except Exception as error:  # any failure is the service's to report
        reason = f"{type(error).__name__}: {error}"
    report.send(("done", reason))
