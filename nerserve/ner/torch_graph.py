"""Eager torch modules behind the runtime-neutral Graph interface (training-time evaluation,
export parity's reference side, and the service's eager runtime: on CUDA its GPU path, with
intermediates on the device, half precision and CUDA graphs; on the CPU for debugging)."""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import Any

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
    if device.type == "cuda":
        tensors = upload_host_values(values, device)
    else:
        tensors = [
            value if isinstance(value, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(value)) for value in values
        ]
    return [as_fed(tensor, device, floats) for tensor in tensors]


def as_fed(tensor: torch.Tensor, device: torch.device, floats: torch.dtype | None) -> torch.Tensor:
    """TENSOR on DEVICE, its floats in FLOATS where given: as it is when it is so already, since a
    call to `to`, like every call into torch, lets the interpreter lock go and must then wait to
    get it back beside a busy thread, even when it changes nothing. A DEVICE without an index
    (`cuda`) is the one the graph's tensors are on."""
    dtype = floats if floats is not None and tensor.dtype.is_floating_point else tensor.dtype
    on = tensor.device
    if dtype == tensor.dtype and on.type == device.type and (device.index is None or on.index == device.index):
        return tensor
    return tensor.to(device, dtype)


def upload_host_values(values: Sequence[Value], device: torch.device, pin: bool = True) -> list[torch.Tensor]:
    """VALUES on DEVICE: host arrays uploaded together (`upload_by_dtype`), tensors as they are."""
    uploaded = iter(
        upload_by_dtype([np.asarray(value) for value in values if not isinstance(value, torch.Tensor)], device, pin)
    )
    return [value if isinstance(value, torch.Tensor) else next(uploaded) for value in values]


def upload_by_dtype(arrays: Sequence[np.ndarray], device: torch.device, pin: bool = True) -> list[torch.Tensor]:
    """Host ARRAYS on DEVICE, in order: those of one dtype copied by numpy into one buffer (pinned,
    where PIN), which goes up in one copy without blocking and comes apart there as views. A
    dtype's group costs four calls into torch and each array at most one (its view), each of which
    lets the interpreter lock go."""
    by_dtype: dict[np.dtype[Any], list[int]] = {}
    for index, array in enumerate(arrays):
        by_dtype.setdefault(array.dtype, []).append(index)
    uploaded: dict[int, torch.Tensor] = {}
    for dtype, indices in by_dtype.items():
        sizes = [arrays[index].size for index in indices]
        packed = torch.empty(sum(sizes), dtype=torch_dtype(dtype), pin_memory=pin)
        np.concatenate([arrays[index].reshape(-1) for index in indices], out=packed.numpy())
        parts = packed.to(device, non_blocking=pin).split(sizes)
        for index, part in zip(indices, parts, strict=True):
            shape = arrays[index].shape
            uploaded[index] = part if len(shape) == 1 else part.view(shape)
    return [uploaded[index] for index in range(len(arrays))]


class _HostFeeds(threading.local):
    """The graph call running in this thread: its feeds uploaded from host arrays, by id."""

    def __init__(self) -> None:
        self.arrays: dict[int, tuple[torch.Tensor, np.ndarray]] = {}


_HOST_FEEDS = _HostFeeds()


@contextlib.contextmanager
def fed_from_host(values: Sequence[Value], tensors: Sequence[torch.Tensor]) -> Iterator[None]:
    """While a graph runs: each of its feeds TENSORS that was uploaded from a host array of VALUES
    can find that array (`host_array_of`)."""
    before = _HOST_FEEDS.arrays
    _HOST_FEEDS.arrays = {
        id(tensor): (tensor, value) for value, tensor in zip(values, tensors, strict=True) if isinstance(value, np.ndarray)
    }
    try:
        yield
    finally:
        _HOST_FEEDS.arrays = before


def host_array_of(feed: torch.Tensor) -> np.ndarray | None:
    """The host array a running graph's FEED was uploaded from, or None (not a feed, an output of an
    earlier graph kept on the device, or a trace or a compile being recorded, which must not hold
    host values as constants). On a GPU, an operator whose result's size or placement depends on a
    device tensor's values (`nonzero`, a packed sequence's lengths) makes the host wait for the
    device mid-pass, and the device then idles while the rest of the pass is launched: what a pass
    can work out from its feeds it works out here, on the host, and uploads
    (docs/decisions/gpu-engine.md)."""
    if torch.jit.is_tracing() or torch.compiler.is_compiling():
        return None
    found = _HOST_FEEDS.arrays.get(id(feed))
    return found[1] if found is not None and found[0] is feed else None


@functools.cache
def torch_dtype(dtype: np.dtype[Any]) -> torch.dtype:
    return torch.from_numpy(np.empty(0, dtype=dtype)).dtype


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
    the copy, so that only half the bytes cross to the host. No call into torch that changes
    nothing (see `as_fed`)."""
    host = out.detach() if out.requires_grad else out
    host = host if host.device.type == "cpu" else host.cpu()
    return (host.float() if host.dtype.is_floating_point and host.dtype != torch.float32 else host).numpy()


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
        values = [inputs[name] for name in self.input_names]
        tensors = to_tensors(values, self.device, self.floats)
        with fed_from_host(values, tensors), torch.inference_mode():
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
