"""TorchScript graphs (torch.jit is deprecated upstream; kept behind this one module so that a
torch.export / AOTInductor runtime can replace it without touching programs or the service)."""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import torch

from nerserve.ner.graph import GraphError, Value
from nerserve.ner.graph_format import TORCHSCRIPT_IO
from nerserve.ner.torch_graph import from_tensors, to_tensors


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
        if self.device.type != "cpu":
            retarget_device_constants(self.module, self.device)
        self.path = path
        try:
            names = json.loads(extra[TORCHSCRIPT_IO])
            self.input_names = tuple(names["inputs"])
            self.output_names = tuple(names["outputs"])
        except (json.JSONDecodeError, KeyError, TypeError):
            raise GraphError(f"{path}: TorchScript graph lacks its {TORCHSCRIPT_IO} (input/output names)") from None

    def run(self, inputs: Mapping[str, Value], keep_on_device: Collection[str] = ()) -> dict[str, Value]:
        tensors = to_tensors([inputs[n] for n in self.input_names], self.device)
        with torch.inference_mode():
            outputs = self.module(*tensors)
        return from_tensors(self.output_names, outputs, keep_on_device, self.device)


def retarget_device_constants(module: Any, device: torch.device) -> None:
    """Point every device a traced graph names onto DEVICE. Export traces on the CPU, and a trace
    keeps the device of each tensor the module made (`torch.arange(n, device=x.device)`, an LSTM's
    zero states) as a constant: `map_location` moves the weights only, so on a GPU those tensors
    would be made on the CPU and meet the GPU's in the next operator. The graphs move nothing to
    the host on purpose (the host copies are the runtime's), so every device constant is the
    serving device. Must run before the module's first call, which fixes its execution plan."""
    for graph in traced_graphs(module):
        for node in graph.findAllNodes("prim::Constant"):
            if node.output().type().kind() == "DeviceObjType":
                node.s_("value", str(device))


def traced_graphs(module: Any) -> list[Any]:
    """The graph of the module and of each submodule the trace called (a container, or a part the
    example never ran, has no forward and so no graph). Typed Any: torch.jit's stubs lack them."""
    return [part.graph for part in module.modules() if part._c._has_method("forward")]
