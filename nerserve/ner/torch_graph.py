"""Eager torch modules behind the runtime-neutral Graph interface (training-time evaluation,
export parity's reference side, and the service's eager runtime: on CUDA its GPU path, with
intermediates on the device, half precision and CUDA graphs; on the CPU for debugging)."""

from __future__ import annotations

from collections.abc import Collection, Mapping

import numpy as np
import torch
from torch import nn
from torch.nn.attention import SDPBackend

from nerserve.ner.graph import Value


def to_tensor(value: Value, device: torch.device, floats: torch.dtype | None = None) -> torch.Tensor:
    """A feed on the device; with FLOATS (a half-precision graph's), a floating-point feed in it.

    A host feed goes to a GPU from pinned memory without blocking: torch's blocking copy waits for
    every kernel queued on the stream before it, so the feeds of a batch's second graph (span's
    seeds, after its encoder was launched) would hold the host until the encoder had run, and the
    device would then idle while the second graph's kernels were launched."""
    tensor = value if isinstance(value, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(value))
    dtype = floats if floats is not None and tensor.is_floating_point() else tensor.dtype
    if device.type == "cuda" and tensor.device.type == "cpu":
        return tensor.pin_memory().to(device, dtype, non_blocking=True)
    return tensor.to(device, dtype)


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
    return {name: out if name in keep else _host_array(out) for name, out in zip(names, outputs, strict=True)}


def as_steps(tokens: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """A step graph's tokens and positions as [R, T]: given [R] (one step, the exported form) or
    [R, T] (T steps at once: eager only, for export parity's teacher-forced check). → the pair and
    whether it was one step (whose scores then drop the T axis again)."""
    one_step = tokens.dim() == 1
    return (tokens.unsqueeze(1), positions.unsqueeze(1), True) if one_step else (tokens, positions, False)


def own_cuda_stream(device: str) -> None:
    """Give the calling thread a CUDA stream of its own (torch's current stream is per thread), so
    that batches run from several threads (the service's graph lanes) queue their kernels on
    separate streams and can overlap on the device instead of waiting in one stream's order."""
    torch.cuda.set_stream(torch.cuda.Stream(torch.device(device)))


def _host_array(out: torch.Tensor) -> np.ndarray:
    """A half-precision output comes back as float32 (numpy decoding is written for it), cast after
    the copy, so that only half the bytes cross to the host."""
    host = out.detach().cpu()
    return (host.float() if host.is_floating_point() and host.dtype != torch.float32 else host).numpy()


# Half precision is the network's weights converted once, at load (`loading.load_model`), and its
# floating-point feeds cast to match. Autocast, which casts the weights again at every call and
# wraps every product in casts, ran slower than fp32 on a GPU (docs/gpu.md).
HALF_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


# Attention's kernels for half precision on CUDA: every one but cuDNN's. On Hopper and Blackwell
# torch tries cuDNN's first for half precision (sdp_utils.cpp, check_prefer_cudnn_attention), and
# cuDNN builds an execution graph for each new batch size and sequence length (tens of ms of host),
# which a served batch nearly always is: converted fp16 took 17x fp32's time at batch 32 on an H200,
# length-sorted, every batch a new shape (docs/gpu.md). gpu_check.sh's bare-encoder rows time both.
SHAPE_FREE_ATTENTION = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def choose_attention_kernels(precision: str, device: torch.device) -> None:
    """Half precision on CUDA: attention off cuDNN's kernels, for the whole process (a switch per
    pass would race between lanes; cuDNN's attention takes half precision only, so an fp32 graph
    beside it loses nothing)."""
    if precision != "fp32" and device.type == "cuda":
        torch.backends.cuda.enable_cudnn_sdp(False)


def half_dtype(precision: str) -> torch.dtype | None:
    """fp16 / bf16 → its dtype; fp32 → None (the weights as trained)."""
    if precision == "fp32":
        return None
    if precision not in HALF_DTYPES:
        raise ValueError(f"precision {precision!r}: fp32, fp16 or bf16")
    return HALF_DTYPES[precision]


class EagerGraph:
    def __init__(
        self,
        module: nn.Module,
        input_names: tuple[str, ...],
        output_names: tuple[str, ...],
        device: str = "cpu",
        precision: str = "fp32",
    ) -> None:
        self.module = module
        self.precision = precision
        self.floats = half_dtype(precision)  # the module's weights are in it already (load_model)
        self.input_names = input_names
        self.output_names = output_names
        self.device = torch.device(device)
        self.device_resident = self.device.type != "cpu"
        replayed = any(getattr(part, "static_backbone", None) is not None for part in module.modules())
        self.execution_provider = (
            f"torch eager on {self.device}"
            + ("" if precision == "fp32" else f" ({precision} weights)")
            + (", backbone replayed from CUDA graphs" if replayed else "")
        )
        choose_attention_kernels(precision, self.device)

    def run(self, inputs: Mapping[str, Value], keep_on_device: Collection[str] = ()) -> dict[str, Value]:
        tensors = [to_tensor(inputs[name], self.device, self.floats) for name in self.input_names]
        with torch.inference_mode():
            outputs = self._run_in_eval_mode(tensors) if self.module.training else self.module(*tensors)
        return from_tensors(self.output_names, outputs, keep_on_device, self.device)

    def _run_in_eval_mode(self, tensors: list[torch.Tensor]) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """A module lent mid-training (evaluation between epochs) runs in eval mode and is handed
        back in train mode. Only then: `eval()` and `train()` each visit every submodule (over a
        hundred in the backbone), host work under the interpreter lock that a served module, loaded
        in eval mode, would pay at every call, and a decoder's step loop at every step."""
        self.module.eval()
        try:
            return self.module(*tensors)
        finally:
            self.module.train()
