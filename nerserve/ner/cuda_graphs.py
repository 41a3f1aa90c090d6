"""The backbone replayed from CUDA graphs at a few fixed shapes (eager runtime on CUDA; serve's
`cuda_graphs`, by default on in fp32).

A small batch's pass on a GPU is bound by Python launching the backbone's kernels, not by the
kernels: the bare MiniLM-L6 took 3.1 ms for one sentence on an H200, where 32 took 3.4 ms
(docs/gpu.md). A CUDA graph, captured once for a shape, launches all of them at once. The
packed rows a batch hands the backbone (`[R, S]` ids, segment ids and positions) are padded up
to the next bucket (ROW_BUCKETS' rows, positions a multiple of POSITION_STEP) with padding's
segment id 0, which no sentence's position attends (`encoder.segment_attention_mask`): each
sentence's states are those it gets unpadded. Shapes beyond the largest bucket, where the
kernels' own time dominates, run eagerly as before.

Every bucket is captured when the model loads, so that no request waits for a capture.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

# Rows at most 1.5 times a batch's; up to 16 rows of 256 sub-words (about 200 CoNLL sentences), past
# which a MiniLM-L6 batch's kernels take longer than their launches (on an H200, 128 sentences took
# 5.6 ms against one's 3.1: docs/gpu.md) and padding would cost more than a replay saves.
ROW_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16)
POSITION_STEP = 32
MAX_POSITIONS = 256  # the packed rows' longest (text.subword), so every row length has a bucket

States = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
# (function, its static inputs) → (its output, a call that recomputes that output in place)
Capture = Callable[[States, tuple[torch.Tensor, ...]], tuple[torch.Tensor, Callable[[], None]]]

# one capture at a time in the process: a capture's warm-up and its memory pool are its own
_CAPTURING = threading.Lock()


def bucket(rows: int, positions: int) -> tuple[int, int] | None:
    """The static shape a batch of ROWS × POSITIONS is padded to, or None where none is (eager)."""
    if positions > MAX_POSITIONS or rows > ROW_BUCKETS[-1]:
        return None
    padded_rows = next(size for size in ROW_BUCKETS if size >= rows)
    return padded_rows, -(-positions // POSITION_STEP) * POSITION_STEP


def every_bucket() -> list[tuple[int, int]]:
    return [(rows, positions) for rows in ROW_BUCKETS for positions in range(POSITION_STEP, MAX_POSITIONS + 1, POSITION_STEP)]


def capture_cuda_graph(states: States, inputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, Callable[[], None]]:
    """STATES over INPUTS (on one CUDA device) as a CUDA graph → its output buffer and its replay.
    One eager run first, on a side stream: what a first call initialises (cuBLAS's handles, the
    caching allocator's blocks) cannot happen inside a capture. `thread_local`: the other graph
    lane may go on launching its own work while this thread captures."""
    device = inputs[0].device
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        states(*inputs)
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        output = states(*inputs)
    return output, graph.replay


@dataclass
class Replay:
    """One bucket's captured graph: the static inputs it reads, the output it writes, and (on CUDA)
    the event after the last caller's copy of that output, which the next caller's stream waits
    for: two graph lanes on streams of their own must not overwrite each other's buffers."""

    inputs: tuple[torch.Tensor, ...]
    output: torch.Tensor
    replay: Callable[[], None]
    lock: threading.Lock = field(default_factory=threading.Lock)
    copied: torch.cuda.Event | None = None  # recorded again by each caller; a wait is for its latest record

    def __call__(self, feeds: tuple[torch.Tensor, ...]) -> torch.Tensor:
        rows, positions = feeds[0].shape
        with self.lock, torch.inference_mode():  # the static buffers are inference tensors
            on_cuda = self.output.device.type == "cuda"
            stream = torch.cuda.current_stream(self.output.device) if on_cuda else None
            if stream is not None and self.copied is not None:
                stream.wait_event(self.copied)
            for static, feed in zip(self.inputs, feeds, strict=True):
                if feed.shape != static.shape:
                    static.zero_()  # padding: id 0, segment 0 (seen by no sentence), position 0
                static[:rows, :positions].copy_(feed)
            self.replay()
            states = self.output[:rows, :positions].clone()
            if stream is not None:
                self.copied = self.copied or torch.cuda.Event()
                self.copied.record(stream)
            return states


class StaticShapeBackbone:
    """STATES (packed ids, segment ids, positions → [R, S, H]) replayed per bucket from graphs
    made by CAPTURE; shapes without a bucket call STATES itself."""

    def __init__(self, states: States, device: torch.device, capture: Capture = capture_cuda_graph) -> None:
        self.states = states
        self.device = device
        self.capture = capture
        self.replays: dict[tuple[int, int], Replay] = {}

    def __call__(self, input_ids: torch.Tensor, segment_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        shape = bucket(*input_ids.shape)
        if shape is None:
            return self.states(input_ids, segment_ids, position_ids)
        return self.replay_for(shape)((input_ids, segment_ids, position_ids))

    def capture_all(self) -> None:
        """Every bucket's graph; a device without the memory for them is an error that says what to
        change, not a stack trace from inside the capture."""
        try:
            for shape in every_bucket():
                self.replay_for(shape)
        except torch.OutOfMemoryError as error:
            raise RuntimeError(
                f"capturing the backbone's CUDA graphs ran out of memory on {self.device} ({error}); "
                "serve fewer models on this device, or serve without CUDA graphs (--no-cuda-graphs)"
            ) from error

    def replay_for(self, shape: tuple[int, int]) -> Replay:
        replay = self.replays.get(shape)
        if replay is not None:
            return replay
        with _CAPTURING, torch.inference_mode():
            if shape not in self.replays:  # another lane may have captured it while this one waited
                inputs = tuple(torch.zeros(shape, dtype=torch.int64, device=self.device) for _ in range(3))
                output, run = self.capture(self.states, inputs)
                self.replays[shape] = Replay(inputs, output, run)
            return self.replays[shape]
