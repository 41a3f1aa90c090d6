"""ONNX Runtime graphs: CUDA execution provider when asked for and present, CPU otherwise.

Outputs a caller keeps on the device (a decoder's key/value cache) go through I/O binding: they
stay OrtValues in device memory and are bound as the next call's inputs as they are. Without
such outputs, or on CPU, a call is a plain `session.run` on numpy arrays.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from pathlib import Path

import numpy as np
import onnxruntime as ort

from nerserve.ner.graph import GraphError, Value

# The levels an export times each graph at (export/session_tuning.py) and records in export.json.
OPTIMIZATION_LEVELS = {
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}
DEFAULT_OPTIMIZATION_LEVEL = "all"


def session_options(optimization_level: str = DEFAULT_OPTIMIZATION_LEVEL, threads: int | None = None) -> ort.SessionOptions:
    """The options every session of a served graph is made with."""
    options = ort.SessionOptions()
    options.graph_optimization_level = OPTIMIZATION_LEVELS[optimization_level]
    if threads:
        options.intra_op_num_threads = threads
    # ONNX Runtime's intra-op threads busy-wait between operators by default. In a server the same
    # cores run the event loop and the next batch's tokenisation, which the spinning starves; idle
    # threads sleep instead.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    # No CPU memory arena: an arena grows to every new batch shape it meets and never gives the
    # memory back, so a server's RSS creeps up for as long as it runs (docs/decisions/memory.md).
    options.enable_cpu_mem_arena = False
    return options


class OnnxGraph:
    def __init__(
        self,
        path: Path,
        device: str = "cpu",
        threads: int | None = None,
        io_binding: bool | None = None,
        optimization_level: str = DEFAULT_OPTIMIZATION_LEVEL,
    ) -> None:
        if optimization_level not in OPTIMIZATION_LEVELS:
            known = sorted(OPTIMIZATION_LEVELS)
            raise GraphError(f"{path}: unknown graph optimisation level {optimization_level!r} (one of {known})")
        options = session_options(optimization_level, threads)
        providers = ["CPUExecutionProvider"]
        on_cuda = device.startswith("cuda") and "CUDAExecutionProvider" in ort.get_available_providers()
        if on_cuda:
            providers.insert(0, "CUDAExecutionProvider")
        try:
            self.session = ort.InferenceSession(str(path), options, providers=providers)
        except Exception as error:  # onnxruntime raises its own Fail/InvalidProtobuf types
            raise GraphError(f"{path}: cannot load ONNX graph ({str(error).splitlines()[0][:200]})") from None
        if device.startswith("cuda") and self.session.get_providers()[0] != "CUDAExecutionProvider":
            # ONNX Runtime falls back to the CPU when its CUDA provider cannot load (a missing
            # driver or library): asked for CUDA, that is an error, not a quieter CPU service
            raise GraphError(
                f"{path}: asked for {device}, but ONNX Runtime runs it on {self.session.get_providers()} "
                "(its CUDA execution provider could not load: see its log above for the missing library or driver)"
            )
        self.path = path
        self.optimization_level, self.threads = optimization_level, threads
        self.device = "cuda" if on_cuda else "cpu"
        # I/O binding is what keeps outputs on a GPU; `io_binding=True` takes that path on CPU too
        # (tests exercise it there), `None` takes it on CUDA only.
        self.io_binding = on_cuda if io_binding is None else io_binding
        self.device_resident = self.io_binding
        self.execution_provider = self.session.get_providers()[0]
        self.input_names = tuple(i.name for i in self.session.get_inputs())
        self.output_names = tuple(o.name for o in self.session.get_outputs())
        self._types = {i.name: _NUMPY_TYPES.get(i.type) for i in self.session.get_inputs()}

    def _feed(self, name: str, value: np.ndarray) -> np.ndarray:
        wanted = self._types[name]
        return value.astype(wanted, copy=False) if wanted is not None else value

    def run(self, inputs: Mapping[str, Value], keep_on_device: Collection[str] = ()) -> dict[str, Value]:
        if self.io_binding and (keep_on_device or any(isinstance(value, ort.OrtValue) for value in inputs.values())):
            return self._run_bound(inputs, set(keep_on_device))
        outputs = self.session.run(None, {name: self._feed(name, inputs[name]) for name in self.input_names})
        return dict(zip(self.output_names, outputs, strict=True))

    def _run_bound(self, inputs: Mapping[str, Value], keep: set[str]) -> dict[str, Value]:
        binding = self.session.io_binding()
        for name in self.input_names:
            value = inputs[name]
            if isinstance(value, ort.OrtValue):
                binding.bind_ortvalue_input(name, value)
            else:
                binding.bind_cpu_input(name, np.ascontiguousarray(self._feed(name, value)))
        for name in self.output_names:
            binding.bind_output(name, self.device if name in keep else "cpu")
        self.session.run_with_iobinding(binding)
        values = binding.get_outputs()
        return {name: value if name in keep else value.numpy() for name, value in zip(self.output_names, values, strict=True)}


_NUMPY_TYPES = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(bool)": np.bool_,
}
