"""A truthful device: a device that cannot be used is an error at start-up, never a silent CPU
service; `auto` takes CUDA only where it works (this machine has no GPU)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from nerserve.ner.graph import GraphError
from nerserve.ner.runtime import DeviceUnavailable, resolve_device


def test_devices_resolve_to_what_can_run_here() -> None:
    assert resolve_device("cpu", "onnx") == "cpu"
    assert resolve_device("auto", "onnx") == "cpu"  # no CUDA provider in the CPU wheel
    with pytest.raises(DeviceUnavailable, match="CUDA execution provider"):
        resolve_device("cuda", "onnx")
    with pytest.raises(DeviceUnavailable, match=r"torch .* sees no CUDA device"):
        resolve_device("cuda:0", "torchscript")
    with pytest.raises(DeviceUnavailable, match="cpu, cuda, cuda:N or auto"):
        resolve_device("tpu", "onnx")


def test_an_onnx_graph_asked_for_cuda_does_not_fall_back_to_the_cpu(tmp_path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper

    from nerserve.ner.runtime.onnx import OnnxGraph

    value = helper.make_tensor_value_info
    relu = helper.make_node("Relu", ["x"], ["y"])
    graph = helper.make_graph([relu], "tiny", [value("x", TensorProto.FLOAT, [2])], [value("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, tmp_path / "tiny.onnx")
    assert OnnxGraph(tmp_path / "tiny.onnx").device == "cpu"
    with pytest.raises(GraphError, match="asked for cuda"):
        OnnxGraph(tmp_path / "tiny.onnx", device="cuda")


def test_serve_on_cuda_without_cuda_exits_non_zero_at_once_naming_cuda() -> None:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "nerserve", "serve", "--device", "cuda", "--models", "span-conll03", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0 and time.monotonic() - started < 60
    assert "--device cuda: CUDA cannot be used here" in done.stderr, done.stderr[-2000:]


def test_batch_bounds_fit_the_device() -> None:
    from nerserve.service.config import Settings

    cpu, cuda = Settings(device="cpu"), Settings(device="cuda:0")
    assert (cpu.batch_size_bound, cpu.batch_tokens_bound, cpu.request_tokens_bound) == (32, 8192, 256)
    assert (cuda.batch_size_bound, cuda.batch_tokens_bound, cuda.request_tokens_bound) == (256, 65536, None)
    assert cuda.close_when_idle and not cpu.close_when_idle
    chosen = Settings(device="cuda", max_batch_size=64, max_batch_tokens=4096)
    assert (chosen.batch_size_bound, chosen.batch_tokens_bound) == (64, 4096)
