"""Which tensors a GPU would hold, followed on the CPU.

A traced graph turns the sizes it reads into 0-dim host tensors (`n = x.shape[1]; n - 1` becomes
`aten::size → prim::NumToTensor → aten::sub`), so on a GPU an operator can meet a host tensor beside
device ones where eager torch passed a Python number. CUDA accepts that only for a 0-dim host
operand of an elementwise arithmetic or comparison operator (TensorIterator's "CPU scalars"); any
other operator stops the pass with "Expected all tensors to be on the same device" (`clamp` with
tensor bounds is one: its iterator does not allow CPU scalars). The CPU runs such a graph without
complaint, so this follows the devices a GPU would see: `WouldBeDevice` wraps a program's graphs so
that they run as device-resident ones (their feeds uploaded, the outputs the program keeps left as
tensors), and `DeviceTags` marks every tensor a GPU would hold (feeds, weights, what factory
operators make: a traced graph's device constants name the serving device once loaded, and
whatever an operator makes from a device tensor) and records every operator that mixes the two
where CUDA would refuse it.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Collection, Mapping
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakTensorKeyDictionary

from nerserve.ner import torch_graph
from nerserve.ner.graph import Value

# elementwise operators whose TensorIterator allows a 0-dim host operand beside device tensors
TAKES_HOST_SCALARS = {
    "add", "sub", "rsub", "mul", "div", "remainder", "floor_divide", "maximum", "minimum", "pow",
    "eq", "ne", "lt", "le", "gt", "ge", "bitwise_and", "bitwise_or", "bitwise_xor", "logical_and", "logical_or",
}  # fmt: skip
# operators that move data between devices, or index a device tensor with host indices (moved for it)
CROSS_DEVICE = {"_to_copy", "copy_", "index", "_local_scalar_dense"}
# operators whose result the host reads (a synchronisation, refused while a stream is capturing)
READ_ON_THE_HOST = {
    "_local_scalar_dense", "item", "is_nonzero", "nonzero", "equal", "masked_select", "_unique2", "unique_consecutive",
}  # fmt: skip
# a packed sequence's lengths go to the host (`lengths.cpu()`, which the CPU does without dispatching)
PACKED_LENGTHS = "_pack_padded_sequence"


class DeviceTags(TorchDispatchMode):
    """Marks would-be device tensors (`mark`, then every operator's outputs from them or made from
    nothing) and counts the operators CUDA would refuse, `refused[(operator, host shapes)]`, those
    that would make the host wait for a device value, `host_reads[operator]`, and the operators
    dispatched by a graph (`in_a_graph`) after the first such wait, `after_a_read[operator]` (each
    launched while the device waits for it)."""

    def __init__(self) -> None:
        super().__init__()
        self.on_device: WeakTensorKeyDictionary = WeakTensorKeyDictionary()
        self.refused: Counter[tuple[str, str]] = Counter()
        self.host_reads: Counter[str] = Counter()
        self.after_a_read: Counter[str] = Counter()
        self.in_a_graph = False

    def mark(self, tensors: Collection[torch.Tensor]) -> None:
        for tensor in tensors:
            self.on_device[tensor] = True

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        name = func.__name__.split(".")[0]
        tensors = [value for value in tree_flatten((args, kwargs))[0] if isinstance(value, torch.Tensor)]
        device = [tensor for tensor in tensors if tensor in self.on_device]
        host = [tensor for tensor in tensors if tensor not in self.on_device]
        if self.host_reads and self.in_a_graph:
            self.after_a_read[name] += 1
        if (name in READ_ON_THE_HOST and device) or (name == PACKED_LENGTHS and args[1] in self.on_device):
            self.host_reads[name] += 1
        if device and host and name not in CROSS_DEVICE:
            shapes = [tuple(tensor.shape) for tensor in host]
            if name not in TAKES_HOST_SCALARS or any(shape != () for shape in shapes):
                self.refused[(name, str(shapes))] += 1
        outputs = func(*args, **kwargs)
        if name == PACKED_LENGTHS:  # the packed data; its batch sizes stay on the host
            self.mark([outputs[0]] if device else [])
        elif device or not tensors:  # from a device tensor, or made from nothing by a retargeted constant
            self.mark([value for value in tree_flatten(outputs)[0] if isinstance(value, torch.Tensor)])
        return outputs


class WouldBeDevice:
    """GRAPH run as a device-resident graph whose device is followed by TAGS."""

    device_resident = True

    def __init__(self, graph: Any, tags: DeviceTags) -> None:
        self.graph = graph
        self.tags = tags

    def __getattr__(self, name: str) -> Any:
        return getattr(self.graph, name)

    def run(self, inputs: Mapping[str, Value], keep_on_device: Collection[str] = ()) -> dict[str, Value]:
        feeds = [self._uploaded(inputs[name]) for name in self.graph.input_names]
        with torch.inference_mode():
            outputs = self.graph.module(*feeds)
        outputs = (outputs,) if isinstance(outputs, torch.Tensor) else outputs
        return {
            name: out if name in keep_on_device else out.numpy()
            for name, out in zip(self.graph.output_names, outputs, strict=True)
        }

    def _uploaded(self, value: Value) -> torch.Tensor:
        if isinstance(value, torch.Tensor):  # kept on the device by an earlier call
            return value
        tensor = torch.from_numpy(np.ascontiguousarray(value))
        self.tags.mark([tensor])
        return tensor


def refused_on_a_gpu(program: Any, sentences: list[list[str]]) -> Counter[tuple[str, str]]:
    """The operators CUDA would refuse as PROGRAM (TorchScript graphs loaded on the CPU) predicts
    SENTENCES with every graph device-resident."""
    tags = DeviceTags()
    for graph in program.graphs.values():
        tags.mark(list(graph.module.parameters()) + list(graph.module.buffers()))
    program.graphs = {name: WouldBeDevice(graph, tags) for name, graph in program.graphs.items()}
    with tags:
        program.predict(sentences)
    return tags.refused


def host_reads_of_a_pass(program: Any, sentences: list[list[str]], monkeypatch: pytest.MonkeyPatch) -> DeviceTags:
    """What PROGRAM (eager graphs loaded on the CPU) reads back from the device while it predicts
    SENTENCES as one batch with every graph device-resident (`host_reads`, `after_a_read`): its
    graphs' weights and everything `torch_graph.to_tensors` uploads (feeds, and what a graph works
    out on the host and sends up itself) count as on the device. The outputs a program hands
    decoding are not counted."""
    tags = DeviceTags()

    def entered(*_: Any) -> None:
        tags.in_a_graph = True

    def left(*_: Any) -> None:
        tags.in_a_graph = False

    for graph in program.graphs.values():
        graph.device_resident = True
        tags.mark(list(graph.module.parameters()) + list(graph.module.buffers()))
        graph.module.register_forward_pre_hook(entered)
        graph.module.register_forward_hook(left)
    upload = torch_graph.to_tensors

    def uploaded(values: Any, device: torch.device, floats: torch.dtype | None = None) -> list[torch.Tensor]:
        tensors = upload(values, device, floats)
        tags.mark(tensors)
        return tensors

    for module in list(sys.modules.values()):
        if module.__name__.startswith("nerserve.") and getattr(module, "to_tensors", None) is upload:
            monkeypatch.setattr(module, "to_tensors", uploaded)
    with tags:
        program.predict(sentences)
    return tags
