"""The graph-set file format, shared by its writer (`export`) and its reader (`ner.runtime`):
one folder per (model, format, source digest) holding one file per graph, the tokenizer, a copy
of the manifest and export.json (signatures, parity figures, ready flag). Standard library only."""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path
from typing import Any

from nerserve.ner.graph import GraphError


class GraphFormat(StrEnum):
    onnx = "onnx"
    torchscript = "torchscript"


class Runtime(StrEnum):
    """What runs a model's graphs: an exported format (ONNX through ONNX Runtime or OpenVINO), or the
    eager torch modules (on CUDA the GPU path; on the CPU for debugging)."""

    onnx = "onnx"
    openvino = "openvino"
    torchscript = "torchscript"
    eager = "eager"

    @property
    def graph_format(self) -> GraphFormat | None:
        """The exported graphs it runs; None for the eager modules."""
        if self == Runtime.eager:
            return None
        return GraphFormat.torchscript if self == Runtime.torchscript else GraphFormat.onnx


GRAPH_SUFFIX = {GraphFormat.onnx: ".onnx", GraphFormat.torchscript: ".pt"}
EXPORT_JSON = "export.json"
TOKENIZER_JSON = "tokenizer.json"
# inside a TorchScript archive: {"inputs": [...], "outputs": [...]} (TorchScript keeps no names)
TORCHSCRIPT_IO = "graph_io.json"


# INT8 graphs are not meant to match fp32 to 1e-4, and are judged by test F1 (docs/decisions/
# cpu-inference.md). A quantisation that broke a model still shows in the export's parity check:
# its entity sets then agree with eager fp32's on few sentences, where the committed models' INT8
# graphs agree on 76-95 % of 200 dev sentences.
INT8_MIN_IDENTICAL_SHARE = 0.5


def int8_refusal(info: dict[str, Any]) -> str | None:
    """Why an INT8 graph set (its export.json) must not be served, or None."""
    parity = info.get("parity", {})
    sentences = int(parity.get("sentences", 0))
    if not sentences:
        return "its export checked no sentences against fp32"
    share = 1.0 - int(parity.get("sentences_differing", 0)) / sentences
    if share >= INT8_MIN_IDENTICAL_SHARE:
        return None
    return (
        f"its INT8 graphs find fp32's entity sets on {share:.0%} of the export's {sentences} parity sentences "
        f"(at least {INT8_MIN_IDENTICAL_SHARE:.0%} to serve them): serve it in fp32"
    )


def graph_file(folder: Path, graph_name: str, fmt: GraphFormat) -> Path:
    return folder / f"{graph_name}{GRAPH_SUFFIX[fmt]}"


def read_export_info(folder: Path) -> dict[str, Any]:
    """export.json of a graph set that is ready to serve; GraphError naming the file otherwise."""
    path = folder / EXPORT_JSON
    try:
        info: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise GraphError(f"{path}: missing (not an export folder)") from None
    except json.JSONDecodeError as error:
        raise GraphError(f"{path}: invalid JSON ({error.msg})") from None
    if not info.get("ready"):
        raise GraphError(f"{path}: export is not marked ready (parity failed or incomplete)")
    return info
