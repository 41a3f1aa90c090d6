"""Graph runtimes (design layer 5): load an exported graph file and run it on a device behind the
runtime-neutral `ner.graph.Graph` interface. ONNX Runtime and TorchScript here; eager torch is
`ner.torch_graph.EagerGraph` (the GPU path's runtime, measured in docs/gpu.md; on the CPU for
debugging; and the reference side of parity checks)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from functools import partial
from pathlib import Path

from nerserve.ner.graph import Graph, GraphError
from nerserve.ner.graph_format import GraphFormat


def lane_stream(runtime: str, device: str) -> Callable[[], None] | None:
    """For a thread that runs batches beside others: torch's runtimes (eager, TorchScript) on CUDA
    give it a stream of its own, so that the threads' kernels can overlap on the device; None where
    the runtime has its own streams (ONNX Runtime) or there is no GPU."""
    if runtime not in ("eager", "torchscript") or not device.startswith("cuda"):
        return None
    from nerserve.ner.torch_graph import own_cuda_stream  # torch only here: its runtimes

    return partial(own_cuda_stream, device)


# Started before a lane's pass, in the lane's thread: the stop it returns, called there once the
# pass is done (its outputs on the host), gives the seconds the device itself spent on the pass.
PassClock = Callable[[], Callable[[], float]]


class OwnSeconds:
    """Seconds counted to the thread that spent them (a lane's passes): `clock` is a PassClock that
    gives what the calling thread adds between it and its stop."""

    def __init__(self) -> None:
        self._threads = threading.local()

    def add(self, seconds: float) -> None:
        self._threads.seconds = self._total() + seconds

    def _total(self) -> float:
        return float(getattr(self._threads, "seconds", 0.0))

    def clock(self) -> Callable[[], float]:
        before = self._total()
        return lambda: self._total() - before


def pass_clock(runtime: str, device: str) -> PassClock | None:
    """The device's own clock for a lane's passes, where the runtime has one: CUDA events on the
    lane's stream for torch's runtimes on CUDA, the stand-in's own account on the simulated device
    (once its graphs have made it). None elsewhere: a pass is then timed by its lane's clock, which
    also counts the lane thread's waits for the interpreter lock."""
    if device == "simulated":
        from nerserve.ner.runtime.simulated import made_simulated_device

        stand_in = made_simulated_device()
        return None if stand_in is None else stand_in.pass_clock
    if runtime in ("eager", "torchscript") and device.startswith("cuda"):
        from nerserve.ner.torch_graph import cuda_pass_clock  # torch only here: its runtimes

        return cuda_pass_clock
    return None


class DeviceUnavailable(RuntimeError):
    """A device that was asked for cannot be used: an error, never a silent fall-back to the CPU."""


def resolve_device(device: str, runtime: str, precision: str = "fp32") -> str:
    """The device the graphs will run on: `cpu`, `cuda[:N]` when that runtime can use CUDA here
    (else DeviceUnavailable, saying why), `auto`: CUDA when it can, the CPU otherwise, or `simulated`:
    stand-in graphs that wait a measured card's batch costs (runtime.simulated; exported graphs only).
    The openvino runtime runs on the CPU, only where OpenVINO is installed, and in bf16 only where
    the CPU has bf16 instructions."""
    if runtime == "openvino":
        return _openvino_device(device, precision)
    if device == "cpu":
        return device
    if device == "simulated":
        if runtime == "eager":
            raise DeviceUnavailable("--device simulated stands in for exported graphs: --runtime onnx or torchscript")
        return device
    reason = _cuda_missing(runtime)
    if device == "auto":
        return "cpu" if reason else "cuda"
    if not device.startswith("cuda"):
        raise DeviceUnavailable(f"--device {device!r}: cpu, cuda, cuda:N, auto or simulated")
    if reason:
        raise DeviceUnavailable(f"--device {device}: CUDA cannot be used here: {reason}")
    return device


def _openvino_device(device: str, precision: str) -> str:
    """OpenVINO runs the graphs on the CPU here (its GPU plugin is for Intel GPUs): `auto` is the CPU."""
    if device not in ("cpu", "auto"):
        raise DeviceUnavailable(
            f"--device {device}: the openvino runtime runs the graphs on the CPU (--device cpu; for CUDA, --runtime onnx)"
        )
    from nerserve.ner.runtime.openvino import cpu_precision_refusal

    try:
        refusal = cpu_precision_refusal(precision)
    except GraphError as error:  # OpenVINO is not installed
        raise DeviceUnavailable(str(error)) from None
    if refusal is not None:
        raise DeviceUnavailable(f"--precision {precision}: {refusal}")
    return "cpu"


def _cuda_missing(runtime: str) -> str | None:
    """Why the runtime cannot run on CUDA here, or None."""
    if runtime == "onnx":
        import onnxruntime as ort

        if "CUDAExecutionProvider" not in ort.get_available_providers():
            return (
                f"this onnxruntime ({ort.__version__}) has no CUDA execution provider "
                "(install onnxruntime-gpu: pip install 'nerserve[gpu]', or use the GPU image)"
            )
        return None
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} sees no CUDA device (built for CUDA: {torch.version.cuda or 'no'})"
    return None


def load_graph(
    path: Path, fmt: GraphFormat, device: str = "cpu", threads: int | None = None, optimization_level: str | None = None
) -> Graph:
    """Load one graph file; a missing or corrupt file raises GraphError naming it. An ONNX graph
    opens at the optimisation level its export measured fastest (ONNX Runtime's "all" when none)."""
    if not path.is_file():
        raise GraphError(f"{path}: graph file missing")
    if fmt == GraphFormat.onnx:
        from nerserve.ner.runtime.onnx import DEFAULT_OPTIMIZATION_LEVEL, OnnxGraph

        return OnnxGraph(path, device, threads, optimization_level=optimization_level or DEFAULT_OPTIMIZATION_LEVEL)
    from nerserve.ner.runtime.torchscript import TorchScriptGraph

    return TorchScriptGraph(path, device)
