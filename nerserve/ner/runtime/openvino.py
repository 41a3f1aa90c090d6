"""OpenVINO graphs: the ONNX export compiled by OpenVINO's CPU plugin, in fp32 or in bf16.

In bf16 the products run on the CPU's AMX tiles where it has them, inside one compiled graph that
holds no interpreter lock while it runs: on a Xeon with AMX, span-conll03 at fp32's F1 ran offline
faster than ONNX Runtime's INT8 graphs, and served under load 1.5 times ONNX Runtime's fp32, below
INT8 (a call's fixed cost for its dynamic shapes weighs on a server's small batches:
docs/decisions/cpu-inference.md). fp32 is asked for explicitly: OpenVINO's own default on such a
CPU is bf16.

One compiled model serves every graph lane: a pass takes an idle infer request (one runs one batch
at a time) and gives it back, and the model has a stream per lane, so that two lanes' batches run
at once rather than in turn. The requests are the graph's, not its threads': a request freed by a
thread ending while the interpreter shuts down (a daemon lane) would wait there for the interpreter
lock it can no longer get, and abort the process.
"""

from __future__ import annotations

import functools
import queue
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from nerserve.ner.graph import GraphError, Value

PRECISION_HINTS = {"fp32": "f32", "bf16": "bf16"}


@functools.cache
def openvino_core() -> Any:
    """OpenVINO's Core, one a process for all its graphs, or GraphError saying how to install it
    (an optional extra)."""
    try:
        import openvino
    except ImportError:
        raise GraphError("--runtime openvino needs OpenVINO: pip install 'nerserve[openvino]'") from None
    return openvino.Core()


def cpu_precision_refusal(precision: str) -> str | None:
    """Why OpenVINO cannot run graphs in PRECISION on this CPU, or None (GraphError where OpenVINO
    is not installed)."""
    return _precision_refusal(openvino_core(), precision)


def _precision_refusal(core: Any, precision: str) -> str | None:
    if precision not in PRECISION_HINTS:
        return f"OpenVINO runs graphs in {' or '.join(PRECISION_HINTS)} on the CPU (asked for {precision})"
    capabilities = core.get_property("CPU", "OPTIMIZATION_CAPABILITIES")
    if precision == "bf16" and "BF16" not in capabilities:
        return f"this CPU has no bf16 instructions (OpenVINO's CPU capabilities: {', '.join(capabilities)}): serve in fp32"
    return None


class OpenVinoGraph:
    device_resident = False  # the host's memory: outputs come back as numpy arrays

    def __init__(
        self, path: Path, output_names: Sequence[str], threads: int | None = None, lanes: int = 1, precision: str = "fp32"
    ) -> None:
        core = openvino_core()
        if (refusal := _precision_refusal(core, precision)) is not None:
            raise GraphError(f"{path}: {refusal}")
        if not path.is_file():
            raise GraphError(f"{path}: graph file missing")
        config: dict[str, Any] = {"INFERENCE_PRECISION_HINT": PRECISION_HINTS[precision], "NUM_STREAMS": lanes}
        if threads:
            config["INFERENCE_NUM_THREADS"] = threads * lanes
        try:
            self.compiled = core.compile_model(core.read_model(str(path)), "CPU", config)
        except RuntimeError as error:  # OpenVINO raises RuntimeError (its Exception) for unreadable graphs
            raise GraphError(f"{path}: cannot compile ONNX graph with OpenVINO ({str(error).splitlines()[0][:200]})") from None
        computed = self.compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()
        if computed != PRECISION_HINTS[precision]:  # a plugin that quietly computes in another precision
            raise GraphError(f"{path}: asked OpenVINO for {precision}, it compiled the graph in {computed}")
        self.path, self.precision = path, precision
        self.execution_provider = f"OpenVINO CPU ({precision})"
        self.input_names = tuple(_onnx_name(port, ()) for port in self.compiled.inputs)
        self.output_names = tuple(_onnx_name(port, output_names) for port in self.compiled.outputs)
        inputs = zip(self.input_names, self.compiled.inputs, strict=True)
        self._types = {name: port.get_element_type().to_dtype() for name, port in inputs}
        self._idle_requests: queue.SimpleQueue[Any] = queue.SimpleQueue()

    def run(self, inputs: Mapping[str, Value], keep_on_device: Collection[str] = ()) -> dict[str, Value]:
        feeds = {name: np.ascontiguousarray(inputs[name], dtype=self._types[name]) for name in self.input_names}
        # shared inputs: the call is synchronous, and the feeds are this call's own arrays; the
        # outputs are copies (the request's own buffers are overwritten by its next batch)
        try:
            request = self._idle_requests.get_nowait()
        except queue.Empty:  # as many requests as passes have run at once
            request = self.compiled.create_infer_request()
        try:
            results = request.infer(feeds, share_inputs=True)
        finally:
            self._idle_requests.put(request)
        return {name: results[port] for name, port in zip(self.output_names, self.compiled.outputs, strict=True)}


def _onnx_name(port: Any, expected: Sequence[str]) -> str:
    """The ONNX name of an input or output. OpenVINO gives a graph output that is also a node's
    output both names (`logits` and `/Squeeze_output_0`), in no set order: the one the graph's
    signature expects, where it names one."""
    names: set[str] = port.get_names()
    chosen = [name for name in expected if name in names]
    return chosen[0] if chosen else port.get_any_name()
