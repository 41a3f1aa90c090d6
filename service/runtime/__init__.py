"""Graph runtimes (design layer 5): load an exported graph file and run it on a device behind the
runtime-neutral `ner.graph.Graph` interface. ONNX Runtime and TorchScript here; eager torch is
`ner.torch_graph.EagerGraph` (debugging, and the reference side of parity checks)."""

from __future__ import annotations

from pathlib import Path

from nerserve.ner.graph import Graph, GraphError
from nerserve.ner.graph_format import GraphFormat


def load_graph(
    path: Path, fmt: GraphFormat, device: str = "cpu", threads: int | None = None, optimization_level: str | None = None
) -> Graph:
    """Load one graph file; a missing or corrupt file raises GraphError naming it. An ONNX graph
    opens at the optimisation level its export measured fastest (ONNX Runtime's "all" when none)."""
    if not path.is_file():
        raise GraphError(f"{path}: graph file missing")
    if fmt == GraphFormat.onnx:
        from nerserve.service.runtime.onnx import DEFAULT_OPTIMIZATION_LEVEL, OnnxGraph

        return OnnxGraph(path, device, threads, optimization_level=optimization_level or DEFAULT_OPTIMIZATION_LEVEL)
    from nerserve.service.runtime.torchscript import TorchScriptGraph

    return TorchScriptGraph(path, device)
