"""An exported graph set on disk (graphs + tokenizer + manifest + export.json) → a runnable program."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nerserve.ner.archs.registry import architecture
from nerserve.ner.graph import Graph, GraphError, GraphSignature
from nerserve.ner.graph_format import GraphFormat, Runtime, graph_file, read_export_info
from nerserve.ner.model_store import Manifest, read_manifest
from nerserve.ner.runtime import load_graph
from nerserve.ner.runtime.simulated import SIMULATED, SimulatedGraph, simulated_device
from nerserve.ner.text.subword import (
    ATTENTION_COST_PER_POSITION,
    UNPADDED_ATTENTION_COST_PER_POSITION,
    SubwordEncoder,
    load_tokenizer,
)


@dataclass
class LoadedGraphSet:
    folder: Path
    manifest: Manifest
    export: dict[str, Any]
    program: Any


def load_graph_set(
    folder: Path,
    device: str = "cpu",
    threads: int | None = None,
    simulated_costs: Path | None = None,
    runtime: Runtime | None = None,
    precision: str = "fp32",
    lanes: int = 1,
) -> LoadedGraphSet:
    """Load a ready export; refuses one whose parity check failed or whose files are missing. On the
    simulated device (`simulated_costs`: its cost table) the graphs are stand-ins (runtime.simulated).
    `runtime` openvino: ONNX graphs compiled by OpenVINO, in `precision`, for `lanes` graph lanes
    (otherwise the format's own runtime, in the precision it was exported in)."""
    info = read_export_info(folder)
    manifest = read_manifest(folder)
    spec = architecture(manifest.architecture)
    config = spec.config_from(manifest.config)
    fmt = GraphFormat(info["format"])
    # export.json's "onnx_session" (export/session_tuning.py); exports older than it have none
    levels = {name: tuned.get("graph_optimization_level") for name, tuned in info.get("onnx_session", {}).items()}
    if device == SIMULATED:
        stand_in = simulated_device(simulated_costs)
        graphs: dict[str, Any] = {
            name: SimulatedGraph(name, info["graphs"][name], stand_in, signature.derived_axes)
            for name, signature in spec.signatures(config).items()
        }
    elif runtime == Runtime.openvino:
        graphs = _openvino_graphs(folder, fmt, spec.signatures(config), threads, lanes, precision)
    else:
        graphs = {
            name: load_graph(graph_file(folder, name, fmt), fmt, device, threads, levels.get(name))
            for name in spec.signatures(config)
        }
    # an encoder whose backbone skips the rows' padding packs shorter rows (ner.unpadded); the
    # simulated device stands in for a GPU's padded passes
    unpadded = info.get("backbone_on_real_subwords_only", False) and device != SIMULATED
    attention_cost = UNPADDED_ATTENTION_COST_PER_POSITION if unpadded else ATTENTION_COST_PER_POSITION
    subwords = SubwordEncoder(load_tokenizer(folder), attention_cost=attention_cost)
    return LoadedGraphSet(folder, manifest, info, spec.build_program(graphs, config, subwords))


def _openvino_graphs(
    folder: Path, fmt: GraphFormat, signatures: dict[str, GraphSignature], threads: int | None, lanes: int, precision: str
) -> dict[str, Graph]:
    from nerserve.ner.runtime.openvino import OpenVinoGraph  # an optional extra: imported where asked for

    if fmt != GraphFormat.onnx:
        raise GraphError(f"{folder}: OpenVINO runs ONNX graphs, this set is {fmt.value}")
    return {
        name: OpenVinoGraph(graph_file(folder, name, fmt), signature.outputs, threads, lanes, precision)
        for name, signature in signatures.items()
    }
