"""Eager torch modules behind the runtime-neutral Graph interface (training-time evaluation,
export parity's reference side, and the service's eager runtime: on CUDA its GPU path, with
intermediates on the device, half precision and CUDA graphs; on the CPU for debugging)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Mapping, Sequence

import numpy as np
import torch
from torch import nn
from torch.nn.attention import SDPBackend

from nerserve.ner.graph import Value


def to_tensors(values: Sequence[Value], device: torch.device, floats: torch.dtype | None = None) -> list[torch.Tensor]:
    """Feeds on DEVICE; with FLOATS (a half-precision graph's), its floating-point feeds in it.

    Host feeds go to a GPU from pinned memory without blocking: torch's blocking copy waits for
    every kernel queued on the stream before it, so the feeds of a batch's second graph (span's
    seeds, after its encoder was launched) would hold the host until the encoder had run, and the
    device would then idle while the second graph's kernels were launched. They go up packed by
    dtype (`upload_by_dtype`): a pass's dozen feeds each pinned and copied on their own cost the
    launching thread two operators and a copy's launch apiece, under the interpreter lock a
    launch-bound pass is short of (docs/decisions/gpu-engine.md)."""
    tensors = [value if isinstance(value, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(value)) for value in values]
    if device.type == "cuda":
        on_host = [index for index, tensor in enumerate(tensors) if tensor.device.type == "cpu"]
        for index, uploaded in zip(on_host, upload_by_dtype([tensors[i] for i in on_host], device), strict=True):
            tensors[index] = uploaded
    return [tensor.to(device, floats if floats and tensor.is_floating_point() else tensor.dtype) for tensor in tensors]


def upload_by_dtype(tensors: Sequence[torch.Tensor], device: torch.device, pin: bool = True) -> list[torch.Tensor]:
    """Host TENSORS on DEVICE, in order: those of one dtype copied into one buffer (pinned, where
    PIN), which goes up in one copy without blocking, and comes apart there as views."""
    by_dtype: dict[torch.dtype, list[int]] = {}
    for index, tensor in enumerate(tensors):
        by_dtype.setdefault(tensor.dtype, []).append(index)
    uploaded: dict[int, torch.Tensor] = {}
    for dtype, indices in by_dtype.items():
        sizes = [tensors[i].numel() for i in indices]
        packed = torch.empty(sum(sizes), dtype=dtype, pin_memory=pin)
        host = packed.numpy()  # filled by numpy: one copy a feed, no operator dispatched
        start = 0
        for index, size in zip(indices, sizes, strict=True):
            host[start : start + size] = tensors[index].reshape(-1).numpy()
            start += size
        parts = packed.to(device, non_blocking=pin).split(sizes)
        for index, part in zip(indices, parts, strict=True):
            uploaded[index] = part.view(tensors[index].shape)
    return [uploaded[index] for index in range(len(tensors))]


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


class _LastPassEnd:
    """The end event of the pass that ended last on the GPU, whichever lane's stream it ran on."""

    lock = threading.Lock()
    event: torch.cuda.Event | None = None


def cuda_pass_clock() -> Callable[[], float]:
    """A pass's own time on the GPU, as the simulated device counts it: from when the device took it
    to its end. An event is recorded on the calling thread's stream now, and one when the returned
    stop is called (after the pass's outputs reached the host); a pass launched on one lane's
    stream while another lane's ran is timed from that one's end where it ended in between (the
    device's clock, across streams). Launch gaps inside the pass count (the device waits on them);
    the thread's wait for the interpreter lock once the pass is done does not."""
    start = torch.cuda.Event(enable_timing=True)
    start.record()

    def stop() -> float:
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        end.synchronize()
        milliseconds = start.elapsed_time(end)
        with _LastPassEnd.lock:
            before, _LastPassEnd.event = _LastPassEnd.event, end
        if before is not None:
            since_before = before.elapsed_time(end)
            if 0 <= since_before < milliseconds:  # the pass before this one ended after this one was launched
                milliseconds = since_before
        return float(milliseconds) / 1000

    return stop


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
        tensors = to_tensors([inputs[name] for name in self.input_names], self.device, self.floats)
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
