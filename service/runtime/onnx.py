"""ONNX Runtime graphs: CUDA execution provider when asked for and present, CPU otherwise."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnxruntime as ort

from ner.graph import GraphError


class OnnxGraph:
    def __init__(self, path: Path, device: str = "cpu", threads: int | None = None) -> None:
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if threads:
            options.intra_op_num_threads = threads
        # ONNX Runtime's intra-op threads busy-wait between operators by default. In a server the
        # same cores run the event loop and the next batch's tokenisation, which the spinning
        # starves; idle threads sleep instead.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        providers = ["CPUExecutionProvider"]
        if device.startswith("cuda") and "CUDAExecutionProvider" in ort.get_available_providers():
            providers.insert(0, "CUDAExecutionProvider")
        try:
            self.session = ort.InferenceSession(str(path), options, providers=providers)
        except Exception as error:  # onnxruntime raises its own Fail/InvalidProtobuf types
            raise GraphError(f"{path}: cannot load ONNX graph ({str(error).splitlines()[0][:200]})") from None
        self.path = path
        self.input_names = tuple(i.name for i in self.session.get_inputs())
        self.output_names = tuple(o.name for o in self.session.get_outputs())
        self._types = {i.name: _NUMPY_TYPES.get(i.type) for i in self.session.get_inputs()}

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        feeds = {}
        for name in self.input_names:
            value = inputs[name]
            wanted = self._types[name]
            feeds[name] = value.astype(wanted, copy=False) if wanted is not None else value
        outputs = self.session.run(None, feeds)
        return dict(zip(self.output_names, outputs, strict=True))


_NUMPY_TYPES = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(bool)": np.bool_,
}
