"""Eager torch modules behind the runtime-neutral Graph interface (training-time evaluation,
export parity's reference side, and the service's eager runtime for debugging)."""

from __future__ import annotations

from collections.abc import Collection, Mapping

import numpy as np
import torch
from torch import nn

from nerserve.ner.graph import Value


def to_tensor(value: Value, device: torch.device) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.to(device)
    return torch.from_numpy(np.ascontiguousarray(value)).to(device)


def from_tensors(
    names: tuple[str, ...],
    outputs: torch.Tensor | tuple[torch.Tensor, ...],
    keep_on_device: Collection[str],
    device: torch.device,
) -> dict[str, Value]:
    """Named outputs as numpy, except those kept on an accelerator (as tensors, for the next call)."""
    if isinstance(outputs, torch.Tensor):
        outputs = (outputs,)
    keep = set(keep_on_device) if device.type != "cpu" else set()
    return {name: out if name in keep else out.detach().cpu().numpy() for name, out in zip(names, outputs, strict=True)}


class EagerGraph:
    def __init__(
        self, module: nn.Module, input_names: tuple[str, ...], output_names: tuple[str, ...], device: str = "cpu"
    ) -> None:
        self.module = module
        self.input_names = input_names
        self.output_names = output_names
        self.device = torch.device(device)

    def run(self, inputs: Mapping[str, Value], keep_on_device: Collection[str] = ()) -> dict[str, Value]:
        tensors = [to_tensor(inputs[name], self.device) for name in self.input_names]
        was_training = self.module.training
        self.module.eval()
        try:
            with torch.inference_mode():
                outputs = self.module(*tensors)
        finally:
            self.module.train(was_training)
        return from_tensors(self.output_names, outputs, keep_on_device, self.device)
