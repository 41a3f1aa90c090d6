"""TorchScript graphs (torch.jit is deprecated upstream; kept behind this one module so that a
torch.export / AOTInductor runtime can replace it without touching programs or the service)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch

from ner.graph import GraphError

GRAPH_IO = "graph_io.json"  # extra file inside the archive: {"inputs": [...], "outputs": [...]}


class TorchScriptGraph:
    def __init__(self, path: Path, device: str = "cpu") -> None:
        self.device = torch.device(device if device != "cuda" or torch.cuda.is_available() else "cpu")
        extra = {GRAPH_IO: ""}
        try:
            self.module = torch.jit.load(str(path), map_location=self.device, _extra_files=extra)
        except Exception as error:  # torch raises RuntimeError/ValueError variants for bad archives
            raise GraphError(f"{path}: cannot load TorchScript graph ({str(error).splitlines()[0][:200]})") from None
        self.module.eval()
        self.path = path
        try:
            names = json.loads(extra[GRAPH_IO])
            self.input_names = tuple(names["inputs"])
            self.output_names = tuple(names["outputs"])
        except (json.JSONDecodeError, KeyError, TypeError):
            raise GraphError(f"{path}: TorchScript graph lacks its {GRAPH_IO} (input/output names)") from None

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        tensors = [torch.from_numpy(np.ascontiguousarray(inputs[n])).to(self.device) for n in self.input_names]
        with torch.inference_mode():
            outputs = self.module(*tensors)
        if isinstance(outputs, torch.Tensor):
            outputs = (outputs,)
        return {name: out.cpu().numpy() for name, out in zip(self.output_names, outputs, strict=True)}
