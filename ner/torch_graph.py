"""Eager torch modules behind the runtime-neutral Graph interface (training-time evaluation,
export parity's reference side, and the service's eager runtime for debugging)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from torch import nn


class EagerGraph:
    def __init__(
        self, module: nn.Module, input_names: tuple[str, ...], output_names: tuple[str, ...], device: str = "cpu"
    ) -> None:
        self.module = module
        self.input_names = input_names
        self.output_names = output_names
        self.device = torch.device(device)

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        tensors = [torch.from_numpy(np.ascontiguousarray(inputs[name])).to(self.device) for name in self.input_names]
        was_training = self.module.training
        self.module.eval()
        try:
            with torch.inference_mode():
                outputs = self.module(*tensors)
        finally:
            self.module.train(was_training)
        if isinstance(outputs, torch.Tensor):
            outputs = (outputs,)
        return {name: out.detach().cpu().numpy() for name, out in zip(self.output_names, outputs, strict=True)}
