"""Graph runtimes (design layer 5): load an exported graph file and run it on a device behind the
runtime-neutral `ner.graph.Graph` interface. ONNX Runtime and TorchScript here; eager torch is
`ner.torch_graph.EagerGraph` (debugging, and the reference side of parity checks)."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path

from ner.graph import Graph, GraphError


class RuntimeName(StrEnum):
    onnx = "onnx"
    torchscript = "torchscript"
    eager = "eager"


GRAPH_SUFFIX = {RuntimeName.onnx: ".onnx", RuntimeName.torchscript: ".pt"}


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        import onnxruntime

        return "CUDAExecutionProvider" in onnxruntime.get_available_providers()
    return bool(torch.cuda.is_available())


def load_graph(path: Path, runtime: RuntimeName, device: str = "cpu", threads: int | None = None) -> Graph:
    """Load one graph file; a missing or corrupt file raises GraphError naming it."""
    if not path.is_file():
        raise GraphError(f"{path}: graph file missing")
    if runtime == RuntimeName.onnx:
        from service.runtime.onnx import OnnxGraph

        return OnnxGraph(path, device, threads)
    if runtime == RuntimeName.torchscript:
        from service.runtime.torchscript import TorchScriptGraph

        return TorchScriptGraph(path, device)
    raise GraphError(f"{path}: runtime {runtime} does not load graph files")
