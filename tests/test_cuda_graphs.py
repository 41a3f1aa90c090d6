"""The backbone replayed from CUDA graphs (ner.cuda_graphs), checked on the CPU: the buckets, the
padding (a sentence's states and entity sets are those it gets unpadded, through a stand-in for
the capture that recomputes its output buffer in place, as a replay does), and that the backbone's
pass holds nothing a capture refuses (an operator that reads a device value on the host). The
capture itself needs a GPU: gpu_check.sh compares it with the plain pass there."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from nerserve.ner.cuda_graphs import MAX_POSITIONS, ROW_BUCKETS, States, StaticShapeBackbone, bucket, every_bucket
from nerserve.ner.data import read_split
from nerserve.ner.loading import load_model
from nerserve.ner.model_store import Locations
from nerserve.ner.torch_graph import EagerGraph
from tests.device_tags import READ_ON_THE_HOST


def stand_in_capture(states: States, inputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, Callable[[], None]]:
    output = states(*inputs)

    def replay() -> None:
        output.copy_(states(*inputs))

    return output, replay


class OperatorNames(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.names: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.names[func.__name__.split(".")[0]] += 1
        return func(*args, **(kwargs or {}))


def backbone_feeds(model: Any, sentences: list[list[str]]) -> list[torch.Tensor]:
    """The packed rows the backbone takes for SENTENCES: ids, segment ids, positions."""
    packed = model.program.subwords.encode(sentences)
    return [torch.from_numpy(rows) for rows in (packed.input_ids, packed.segment_ids, packed.position_ids)]


@pytest.fixture(scope="module")
def span() -> Any:
    return load_model(Locations().model_dir("span-conll03"), "cpu", merged=True)


def test_each_batch_shape_up_to_the_largest_bucket_has_one_and_beyond_it_none() -> None:
    assert bucket(1, 7) == (1, 32)
    assert bucket(5, 33) == (6, 64)
    assert bucket(ROW_BUCKETS[-1], MAX_POSITIONS) == (ROW_BUCKETS[-1], MAX_POSITIONS)
    assert bucket(ROW_BUCKETS[-1] + 1, 10) is None
    assert bucket(1, MAX_POSITIONS + 1) is None
    shapes = every_bucket()
    assert len(shapes) == len(set(shapes)) == len(ROW_BUCKETS) * MAX_POSITIONS // 32


def test_padded_replays_give_each_sentence_its_own_states_and_entities(span: Any, data_root: Path) -> None:
    encoder = span.network.encoder
    sentences = [list(s.tokens) for s in read_split(data_root / "conll03", "test", 40)]
    expected = [span.program.predict(sentences[:count]) for count in (1, 7, 40)]
    captured: list[tuple[int, int]] = []

    def counted_capture(states: States, inputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, Callable[[], None]]:
        captured.append(tuple(inputs[0].shape))  # type: ignore[arg-type]
        return stand_in_capture(states, inputs)

    static = StaticShapeBackbone(encoder.backbone_layers, torch.device("cpu"), counted_capture)
    for count in (1, 7, 40):
        feeds = backbone_feeds(span, sentences[:count])
        with torch.inference_mode():
            direct, replayed = encoder.backbone_layers(*feeds), static(*feeds)
        assert bucket(*feeds[0].shape) is not None and replayed.shape == direct.shape
        real = feeds[1] > 0  # padding's states are nobody's
        torch.testing.assert_close(replayed[real], direct[real], atol=1e-5, rtol=1e-5)
    encoder.static_backbone = static
    try:
        assert [span.program.predict(sentences[:count]) for count in (1, 7, 40)] == expected
        graph = EagerGraph(encoder, ("input_ids",), ("word_states",))
        assert graph.execution_provider == "torch eager on cpu, backbone replayed from CUDA graphs"  # as /info says
    finally:
        encoder.static_backbone = None
    assert EagerGraph(encoder, ("input_ids",), ("word_states",)).execution_provider == "torch eager on cpu"
    assert captured and len(captured) == len(set(captured)) == len(static.replays)  # each bucket once


def test_a_batch_beyond_the_largest_bucket_runs_the_backbone_itself() -> None:
    calls: list[tuple[int, ...]] = []

    def states(ids: torch.Tensor, segments: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        calls.append(tuple(ids.shape))
        return ids.unsqueeze(-1).float()

    static = StaticShapeBackbone(states, torch.device("cpu"), stand_in_capture)
    rows = ROW_BUCKETS[-1] + 1
    ids = torch.ones(rows, 8, dtype=torch.int64)
    assert static(ids, ids, ids).shape == (rows, 8, 1)
    assert calls == [(rows, 8)] and not static.replays


def test_a_smaller_batch_after_a_full_one_finds_its_bucket_padded_again() -> None:
    """A batch that fills its bucket overwrites every static position; the next, smaller one of that
    bucket must find padding (zeros) there again, not the last batch's ids."""

    def row_sums(ids: torch.Tensor, segments: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return (ids + segments + positions).sum(dim=1, keepdim=True).expand_as(ids).unsqueeze(-1).float()

    static = StaticShapeBackbone(row_sums, torch.device("cpu"), stand_in_capture)
    full, part = torch.ones(3, 64, dtype=torch.int64), torch.ones(3, 40, dtype=torch.int64)
    assert bucket(3, 64) == bucket(3, 40) == (3, 64)
    assert static(full, full, full).unique().tolist() == [192.0]
    assert static(part, part, part).unique().tolist() == [120.0]


def test_the_backbones_pass_reads_nothing_on_the_host(span: Any, data_root: Path) -> None:
    """A capture fails on an operator that waits for the device to hand the host a value: the
    backbone's pass (what is captured) has none, whatever the batch."""
    sentences = [list(s.tokens) for s in read_split(data_root / "conll03", "test", 9)]
    feeds = backbone_feeds(span, sentences)
    with OperatorNames() as seen, torch.inference_mode():
        span.network.encoder.backbone_layers(*feeds)
    assert seen.names and not READ_ON_THE_HOST & set(seen.names), seen.names


def test_cuda_graphs_are_for_the_eager_runtime_on_cuda() -> None:
    from pydantic import ValidationError

    from nerserve.service.config import Settings

    assert Settings(device="cuda", runtime="eager", cuda_graphs=True).replays_cuda_graphs
    with pytest.raises(ValidationError, match="cuda_graphs runs on CUDA with the eager runtime only"):
        Settings(device="cpu", runtime="eager", cuda_graphs=True)
    with pytest.raises(ValidationError, match="asked for runtime onnx on device cuda"):
        Settings(device="cuda", cuda_graphs=True)
    with pytest.raises(ValueError, match="CUDA graphs are for a model loaded merged on CUDA"):
        load_model(Locations().model_dir("span-conll03"), "cpu", merged=True, cuda_graphs=True)


def test_cuda_graphs_are_on_by_default_for_fp32_eager_on_cuda_only() -> None:
    """Measured exact and faster on a GPU in fp32 (docs/gpu.md); half precision with them is not yet
    compared there, the CPU and the exported runtimes cannot capture, and each default yields to an
    explicit setting."""
    from nerserve.service.config import Settings

    assert Settings(device="cuda", runtime="eager").replays_cuda_graphs
    assert Settings(device="cuda:1", runtime="eager").replays_cuda_graphs
    assert not Settings(device="cuda", runtime="eager", cuda_graphs=False).replays_cuda_graphs
    assert not Settings(device="cuda", runtime="eager", precision="fp16").replays_cuda_graphs
    assert Settings(device="cuda", runtime="eager", precision="fp16", cuda_graphs=True).replays_cuda_graphs
    assert not Settings(device="cpu", runtime="eager").replays_cuda_graphs
    assert not Settings(device="cuda", runtime="torchscript").replays_cuda_graphs
    assert not Settings(device="cuda").replays_cuda_graphs


def test_a_device_out_of_memory_while_capturing_says_what_to_change() -> None:
    def out_of_memory(states: States, inputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, Callable[[], None]]:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 24.00 MiB")

    static = StaticShapeBackbone(lambda *feeds: feeds[0], torch.device("cpu"), out_of_memory)
    with pytest.raises(RuntimeError, match=r"ran out of memory on cpu \(CUDA out of memory.*--no-cuda-graphs"):
        static.capture_all()
