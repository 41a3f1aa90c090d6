"""TorchScript graphs (torch.jit is deprecated upstream; kept behind this one module so that a
torch.export / AOTInductor runtime can replace it without touching programs or the service)."""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from pathlib import Path

import torch

from nerserve.ner.graph import GraphError, Value
from nerserve.ner.graph_format import TORCHSCRIPT_IO
from nerserve.ner.torch_graph import from_tensors, to_tensor


class TorchScriptGraph:
    def __init__(self, path: Path, device: str = "cpu") -> None:
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise GraphError(f"{path}: asked for {device}, but torch sees no CUDA device")
        self.device = torch.device(device)
        self.device_resident = self.device.type != "cpu"
        self.execution_provider = f"TorchScript on {self.device}"
        extra = {TORCHSCRIPT_IO: ""}
        try:
            self.module = torch.jit.load(str(path), map_location=self.device, _extra_files=extra)
        except Exception as error:  # torch raises RuntimeError/ValueError variants for bad archives
            raise GraphError(f"{path}: cannot load TorchScript graph ({str(error).splitlines()[0][:200]})") from None
        self.module.eval()
        self.path = path
        try:
            names = json.loads(extra[TORCHSCRIPT_IO])
            self.input_names = tuple(names["inputs"])
            self.output_names = tuple(names["outputs"])
        except (json.JSONDecodeError, KeyError, TypeError):
            raise GraphError(f"{path}: TorchScript graph lacks its {TORCHSCRIPT_IO} (input/output names)") from None

    def run(self, inputs: Mapping[str, Value], keep_on_device: Collection[str] = ()) -> dict[str, Value]:
        tensors = [to_tensor(inputs[n], self.device) for n in self.input_names]
        with torch.inference_mode():
            outputs = self.module(*tensors)
        return from_tensors(self.output_names, outputs, keep_on_device, self.device)
