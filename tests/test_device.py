"""A truthful device: a device that cannot be used is an error at start-up, never a silent CPU
service; `auto` takes CUDA only where it works (this machine has no GPU)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
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
    with pytest.raises(DeviceUnavailable, match="cpu, cuda, cuda:N, auto or simulated"):
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


def test_the_server_sets_how_soon_a_thread_gets_the_interpreter_before_it_checks_the_device() -> None:
    """`--interpreter-switch-ms` reaches the process (an eager lane beside a busy thread waits up to
    it for the lock at every operator), set first thing, even where the device then ends the start."""
    from nerserve.service.config import Settings
    from nerserve.service.server import run

    before = sys.getswitchinterval()
    try:
        with pytest.raises(SystemExit, match="CUDA cannot be used here"):
            run(Settings(device="cuda", interpreter_switch_ms=0.25))
        assert sys.getswitchinterval() == pytest.approx(0.00025)
    finally:
        sys.setswitchinterval(before)
    with pytest.raises(ValueError, match="greater than 0"):
        Settings(interpreter_switch_ms=0)


def test_batch_bounds_fit_the_device() -> None:
    from nerserve.service.config import Settings

    cpu, cuda = Settings(device="cpu"), Settings(device="cuda:0")
    assert (cpu.batch_size_bound, cpu.batch_tokens_bound, cpu.request_tokens_bound) == (32, 8192, 256)
    assert (cuda.batch_size_bound, cuda.batch_tokens_bound, cuda.request_tokens_bound) == (256, 65536, None)
    chosen = Settings(device="cuda", max_batch_size=64, max_batch_tokens=4096)
    assert (chosen.batch_size_bound, chosen.batch_tokens_bound) == (64, 4096)


def test_graph_lanes_default_to_two_for_onnx_on_a_cpu_of_two_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    from nerserve.service import config
    from nerserve.service.config import Settings

    monkeypatch.setattr(config, "usable_cores", lambda: 8)
    monkeypatch.setattr(config, "machine_cores", lambda: 8)
    cpu = Settings(device="cpu")
    assert (cpu.lanes, cpu.graph_threads) == (2, 4)  # the cores shared between the lanes
    assert Settings(device="cpu", threads=3).graph_threads == 3
    assert Settings(device="cpu", graph_lanes=1).graph_threads is None  # the runtime's own: every core
    assert [Settings(runtime="eager").lanes, Settings(graph_process=True).lanes] == [1, 1]
    # a device behind HTTP workers launches its next pass while one runs
    assert [Settings(device="cuda").lanes, Settings(device="simulated").lanes] == [2, 2]
    # a graph process runs as many lanes, each over a pipe of its own
    assert Settings(device="cuda", graph_process=True).lanes == 2
    monkeypatch.setattr(config, "usable_cores", lambda: 1)
    assert Settings(device="cpu").lanes == 1
    assert Settings(device="cuda").lanes == 1  # one core: the front shares the engine's loop
    assert Settings(device="cuda", http_workers=2).lanes == 2
    assert Settings(graph_lanes=2, graph_process=True).lanes == 2


def test_http_workers_default_to_one_on_the_cpu_and_to_the_cores_but_two_on_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    from nerserve.service import config
    from nerserve.service.config import Settings

    for cores, workers in [(16, 8), (32, 8), (6, 4), (3, 1), (2, 1)]:
        monkeypatch.setattr(config, "usable_cores", lambda cores=cores: cores)
        assert Settings(device="cpu").front_workers == 1
        assert Settings(device="cuda").front_workers == Settings(device="simulated").front_workers == workers, cores
        assert Settings(device="cuda", http_workers=1).front_workers == 1


def test_one_lane_on_fewer_cores_than_the_machine_has_gets_threads_for_those_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    # ONNX Runtime's own default is the machine's cores, whatever the process may use: a pod
    # limited to one CPU on a 64-core node would otherwise split each operator 64 ways
    from nerserve.service import config
    from nerserve.service.config import Settings

    monkeypatch.setattr(config, "machine_cores", lambda: 64)
    monkeypatch.setattr(config, "usable_cores", lambda: 1)
    assert (Settings(device="cpu").lanes, Settings(device="cpu").graph_threads) == (1, 1)
    monkeypatch.setattr(config, "usable_cores", lambda: 6)
    assert Settings(device="cpu", graph_lanes=1).graph_threads == 6
    assert Settings(device="cpu", graph_process=True).graph_threads == 6
    assert Settings(device="cpu", graph_lanes=1, threads=2).graph_threads == 2


def test_usable_cores_follow_a_containers_cpu_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    from nerserve.service import config

    cores = len(os.sched_getaffinity(0))
    limit = tmp_path / "cpu.max"
    monkeypatch.setattr(config, "CGROUP_CPU_MAX", limit)
    assert config.usable_cores() == cores  # no such file: no limit
    limit.write_text("max 100000\n")
    assert config.usable_cores() == cores
    limit.write_text("150000 100000\n")  # one and a half CPUs: one whole
    assert config.usable_cores() == 1
    limit.write_text(f"{100000 * (cores + 4)} 100000\n")  # more than the cores: the cores
    assert config.usable_cores() == cores


def test_torch_lanes_on_cuda_launch_on_streams_of_their_own() -> None:
    from nerserve.service.config import Settings
    from nerserve.service.models import _lane_stream

    for runtime in ("eager", "torchscript"):
        on_streams = _lane_stream(Settings(device="cuda", runtime=runtime, http_workers=2))  # two lanes by default
        assert on_streams is not None and on_streams.args == ("cuda",)
    for one_stream in ({"device": "cuda", "runtime": "eager", "graph_lanes": 1}, {"device": "cuda"}, {"graph_lanes": 2}):
        assert _lane_stream(Settings(**one_stream)) is None  # one lane, ONNX Runtime's own streams, or the CPU


def test_the_simulated_device_batches_as_a_gpu_and_needs_exported_graphs() -> None:
    from nerserve.service.config import Settings

    simulated = Settings(device="simulated")
    assert (simulated.batch_size_bound, simulated.request_tokens_bound) == (256, None)
    assert resolve_device("simulated", "onnx") == "simulated"
    with pytest.raises(DeviceUnavailable, match="exported graphs"):
        resolve_device("simulated", "eager")


def test_the_simulated_device_waits_its_table_and_counts_it() -> None:
    from nerserve.ner.runtime.simulated import SimulatedDevice

    device = SimulatedDevice.from_file()
    assert "H100" in device.card and "simulated" in device.card
    assert device.batch_seconds(2403) == pytest.approx(0.003561)
    assert device.batch_seconds(1000) == pytest.approx(0.002632 + (0.003561 - 0.002632) * (1000 - 601) / (2403 - 601))
    beyond = 0.012190 + (0.012190 - 0.003561) / (9613 - 2403) * (20000 - 9613)
    assert device.batch_seconds(20000) == pytest.approx(beyond)  # extrapolated at the last slope
    started = time.perf_counter()
    device.run(9613)
    assert time.perf_counter() - started >= 0.0121
    assert device.passes == 1 and device.busy_seconds == pytest.approx(0.012190)


def test_a_pass_launched_while_another_runs_is_queued_behind_it() -> None:
    """As on a GPU, two passes launched at once run one after the other: the second ends a pass
    after the first, and the device is busy for both."""
    from nerserve.ner.runtime.simulated import SimulatedDevice

    device = SimulatedDevice("card", "test", np.array([1.0, 100.0]), np.array([100.0, 100.0]))
    ended: list[float] = []
    started = time.perf_counter()
    lanes = [threading.Thread(target=lambda: (device.run(10), ended.append(time.perf_counter()))) for _ in range(2)]
    for lane in lanes:
        lane.start()
    for lane in lanes:
        lane.join()
    first, second = sorted(end - started for end in ended)
    assert 0.1 <= first < 0.15 and 0.2 <= second < 0.25
    assert device.passes == 2 and device.busy_seconds == pytest.approx(0.2)


def test_the_simulated_devices_clock_gives_each_thread_its_own_passes_time_on_the_device() -> None:
    """Two lanes launch a pass of 100 ms each at once: the second waits for the first, then the
    device takes it. Each lane's clock says 100 ms, the device's time for its own pass: not the
    second's 200 ms from its launch, nor the other lane's pass. The service takes the clock from
    the device the graphs made (`runtime.pass_clock`); runtimes without one time a pass by its lane."""
    from nerserve.ner.runtime import pass_clock
    from nerserve.ner.runtime.simulated import SimulatedDevice

    device = SimulatedDevice("card", "test", np.array([1.0, 100.0]), np.array([100.0, 100.0]))
    own: list[float] = []

    def lane() -> None:
        stop = device.pass_clock()
        device.run(10)
        own.append(stop())

    lanes = [threading.Thread(target=lane) for _ in range(2)]
    for thread in lanes:
        thread.start()
    for thread in lanes:
        thread.join()
    assert own == [pytest.approx(0.1, abs=0.005)] * 2
    assert device.pass_clock()() == 0.0  # nothing launched since
    assert pass_clock("onnx", "cpu") is None and pass_clock("torchscript", "cpu") is None


def test_torchs_runtimes_on_cuda_time_a_pass_by_events_on_the_lanes_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    """On CUDA a lane's pass is timed by two events on its stream: one recorded as the pass starts,
    one as its stop is called, which waits for it; their elapsed milliseconds are the pass's time,
    or, where the pass before it on the device (another lane's) ended after it was launched, the
    time since that one's end. (The events themselves need a card: faked here, read on one by
    gpu_check.sh's batch log.)"""
    import torch

    from nerserve.ner import torch_graph
    from nerserve.ner.runtime import pass_clock

    said: list[str] = []
    # device milliseconds between events (by their numbers): pass A from 1 to 3; pass B, launched
    # on the other lane's stream while A ran, from 2 to 4, 2.0 ms of it after A's end
    times = {(1, 3): 3.5, (2, 4): 5.0, (3, 4): 2.0}

    class Event:
        made = 0

        def __init__(self, enable_timing: bool = False) -> None:
            assert enable_timing
            Event.made += 1
            self.number = Event.made

        def record(self) -> None:
            said.append(f"record {self.number}")

        def synchronize(self) -> None:
            said.append(f"synchronize {self.number}")

        def elapsed_time(self, end: Event) -> float:
            said.append(f"elapsed {self.number} to {end.number}")
            return times[self.number, end.number]

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch_graph._LastPassEnd, "event", None)
    assert pass_clock("eager", "cuda") is torch_graph.cuda_pass_clock
    assert pass_clock("torchscript", "cuda:1") is torch_graph.cuda_pass_clock and pass_clock("onnx", "cuda") is None
    stop_a = torch_graph.cuda_pass_clock()
    stop_b = torch_graph.cuda_pass_clock()
    assert stop_a() == pytest.approx(0.0035)
    assert said == ["record 1", "record 2", "record 3", "synchronize 3", "elapsed 1 to 3"]
    said.clear()
    assert stop_b() == pytest.approx(0.002)  # from A's end, not from its own launch behind A
    assert said == ["record 4", "synchronize 4", "elapsed 2 to 4", "elapsed 3 to 4"]


def test_a_bundled_cost_table_is_named_by_its_file_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--simulated-device-costs h100-span-conll03-offline.json` takes the bundled table of span's
    own H100 batches; a file of that name where the server runs, or any path, is read instead."""
    from nerserve.ner.runtime.simulated import SimulatedDevice

    monkeypatch.chdir(tmp_path)
    span = SimulatedDevice.from_file(Path("h100-span-conll03-offline.json"))
    assert "H100" in span.card and span.batch_seconds(2403) == pytest.approx(0.020911)
    (tmp_path / "h100-span-conll03-offline.json").write_text(
        '{"card": "mine", "source": "here", "points": [{"subwords": 1, "ms": 1}, {"subwords": 2, "ms": 2}]}'
    )
    assert SimulatedDevice.from_file(Path("h100-span-conll03-offline.json")).card == "mine"
    with pytest.raises(FileNotFoundError):
        SimulatedDevice.from_file(Path("no-such-table.json"))


def test_simulated_graphs_answer_zeros_of_the_recorded_shapes(tmp_path: Path) -> None:
    import numpy as np

    from nerserve.ner.runtime.simulated import DeviceZeros, SimulatedDevice, SimulatedGraph

    table = {"card": "test card", "source": "a test", "points": [{"subwords": 0, "ms": 0.0}, {"subwords": 1000, "ms": 1.0}]}
    (tmp_path / "costs.json").write_text(__import__("json").dumps(table))
    device = SimulatedDevice.from_file(tmp_path / "costs.json")
    info = {
        "inputs": [{"name": "input_ids", "dtype": "int64", "axes": ["rows", "row_subwords"]},
                   {"name": "word_mask", "dtype": "float32", "axes": ["batch", "words"]}],
        "outputs": [{"name": "word_states", "dtype": "float32", "axes": ["batch", "words", 384]},
                    {"name": "spans", "dtype": "int64", "axes": ["batch", "spans", 2]}],
    }  # fmt: skip
    graph = SimulatedGraph("encoder", info, device, {})
    feeds = {"input_ids": np.zeros((3, 200), np.int64), "word_mask": np.ones((5, 17), np.float32)}
    with pytest.raises(GraphError, match="follow from no input"):  # "spans" is no input's axis
        graph.run(feeds)
    derived = SimulatedGraph("encoder", info, device, {"spans": ("words", 3)}).run(feeds)  # as its signature says
    assert derived["spans"].shape == (5, 20, 2)
    info["outputs"].pop()
    answers = SimulatedGraph("encoder", info, device, {}).run(feeds)
    assert answers["word_states"].shape == (5, 17, 384) and answers["word_states"].dtype == np.float32
    assert not answers["word_states"].any()
    assert device.busy_seconds == pytest.approx(0.0012) and device.passes == 2  # 600 positions, each run
    # as a GPU's graphs, outputs kept on the device are not made on the host, and other graphs read them
    graph = SimulatedGraph("encoder", info, device, {})
    kept = graph.run(feeds, keep_on_device=("word_states",))["word_states"]
    assert graph.device_resident and kept == DeviceZeros((5, 17, 384), np.dtype(np.float32))
    head = {
        "inputs": [{"name": "word_states", "dtype": "float32", "axes": ["batch", "words", 384]}],
        "outputs": [{"name": "scores", "dtype": "float32", "axes": ["batch", "words"]}],
    }
    scores = SimulatedGraph("head", head, device, {}).run({"word_states": kept})["scores"]
    assert isinstance(scores, np.ndarray) and scores.shape == (5, 17) and device.passes == 3  # no backbone wait


@pytest.mark.parametrize("model", sorted(p.name for p in Path("model_store").iterdir() if p.is_dir()))
def test_every_output_axis_of_a_committed_model_follows_from_its_inputs(model: str) -> None:
    """What a stand-in graph needs to answer a graph's shapes: each named output axis is an input's
    axis or derived from one (the decoders' caches and pointer vocabularies)."""
    from nerserve.ner.archs.registry import architecture
    from nerserve.ner.model_store import read_manifest

    manifest = read_manifest(Path("model_store") / model)
    spec = architecture(manifest.architecture)
    for name, signature in spec.signatures(spec.config_from(manifest.config)).items():
        known = {axis for i in signature.inputs for axis in signature.axes[i] if axis}
        derived = {axis for axis, (source, _) in signature.derived_axes.items() if source in known or not source}
        unknown = {axis for o in signature.outputs for axis in signature.axes[o] if axis} - known - derived
        assert not unknown, f"{model} graph {name}: output axes {unknown} follow from no input"


@pytest.mark.parametrize(
    "layout",
    [{}, {"graph_process": "true", "http_workers": 2}],
    ids=["one-process", "graph-process-two-lanes"],
)
def test_a_server_on_the_simulated_device_answers_and_reports_its_device(layout: dict[str, Any]) -> None:
    """In a graph process the stand-ins wait there, and the child reports the device's busy time."""
    import httpx

    from tests.serving import Server

    server = Server(models="span-conll03", device="simulated", threads=1, **layout)
    try:
        server.wait_ready()
        texts = ["EU rejects German call to boycott British lamb.", "Peter Blackburn lives in Paris."]
        answer = httpx.post(f"{server.url}/extract", json={"texts": texts}, timeout=30)
        assert answer.status_code == 200 and len(answer.json()["results"]) == 2
        info = httpx.get(f"{server.url}/info").json()
        assert info["device"] == "simulated" and info["batching"]["max_batch_size"] == 256
        assert info["simulated_device"]["passes"] >= 2 and info["simulated_device"]["busy_seconds"] > 0  # warm-up + this
        assert "simulated" in info["simulated_device"]["card"]
        assert info["execution_providers"]["span-conll03"] == {"encoder": "simulated", "span_proposal": "simulated"}
    finally:
        server.stop()
    assert server.process.returncode == 0


def test_half_precision_is_for_the_eager_runtime_on_cuda() -> None:
    from pydantic import ValidationError

    from nerserve.service.config import Settings

    assert Settings(device="cuda", runtime="eager", precision="fp16").precision == "fp16"
    with pytest.raises(ValidationError, match="precision bf16 runs on CUDA with the eager runtime only"):
        Settings(device="cpu", runtime="eager", precision="bf16")
    with pytest.raises(ValidationError, match="asked for runtime onnx on device cuda"):
        Settings(device="cuda", precision="fp16")


def test_half_precision_outputs_reach_decoding_as_float32() -> None:
    import torch

    from nerserve.ner.torch_graph import EagerGraph

    graph = EagerGraph(torch.nn.Linear(4, 3).to(torch.bfloat16), ("x",), ("y",), precision="bf16")
    outputs = graph.run({"x": torch.randn(2, 4).numpy()})  # a float32 feed, cast to the weights' bf16
    assert outputs["y"].dtype == np.float32 and outputs["y"].shape == (2, 3)
    with pytest.raises(ValueError, match="fp32, fp16 or bf16"):
        EagerGraph(torch.nn.Linear(4, 3), ("x",), ("y",), precision="int4")


def test_a_graph_traced_on_the_cpu_makes_its_tensors_on_the_device_it_is_loaded_for(tmp_path: Path) -> None:
    """A trace keeps `device=x.device` as the tracing device, in the module and in its submodules;
    retargeted at load, the tensors the graph makes are made on the serving device ("meta" stands
    in for a GPU here: the CPU can make tensors on it)."""
    import torch

    from nerserve.ner.runtime.torchscript import retarget_device_constants

    class Zeros(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.zeros(x.shape[0], device=x.device)

    class Made(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.zeros = Zeros()

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return torch.arange(x.shape[0], device=x.device), self.zeros(x)

    torch.jit.save(torch.jit.trace(Made(), (torch.ones(3, 2),)), str(tmp_path / "made.pt"))
    on_meta = torch.ones(5, 2, device="meta")
    as_traced = torch.jit.load(str(tmp_path / "made.pt"), map_location="meta")
    assert {t.device.type for t in as_traced(on_meta)} == {"cpu"}  # what a GPU would have met
    retargeted = torch.jit.load(str(tmp_path / "made.pt"), map_location="meta")
    retarget_device_constants(retargeted, torch.device("meta"))
    made = retargeted(on_meta)
    assert {t.device.type for t in made} == {"meta"} and made[0].shape == (5,)


def test_half_precision_on_cuda_keeps_attention_off_cudnn() -> None:
    """cuDNN's attention builds a plan per shape (see torch_graph.SHAPE_FREE_ATTENTION): a half-
    precision graph on CUDA turns it off; fp32, or the CPU, keep torch's choice."""
    import torch

    from nerserve.ner.torch_graph import choose_attention_kernels

    try:
        for precision, device in (("fp32", "cuda"), ("bf16", "cpu")):
            choose_attention_kernels(precision, torch.device(device))
            assert torch.backends.cuda.cudnn_sdp_enabled()
        choose_attention_kernels("fp16", torch.device("cuda"))
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        assert torch.backends.cuda.flash_sdp_enabled() and torch.backends.cuda.mem_efficient_sdp_enabled()
    finally:
        torch.backends.cuda.enable_cudnn_sdp(True)


def test_a_bound_read_from_a_shape_reaches_a_traced_graph_as_one_cuda_takes() -> None:
    """Traced, `clamp(max=n - 1)` takes the size as a 0-dim host tensor beside the device's values,
    which CUDA refuses (span-conll03's TorchScript graphs stopped on a GPU so); `at_most` makes the
    bound on the values' device. Followed on the CPU by tests/device_tags.py."""
    import torch

    from nerserve.ner.archs.span.graphs import at_most
    from tests.device_tags import DeviceTags

    class Clamped(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.clamp(x, max=x.shape[0] - 1)

    class Bounded(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return at_most(x, x.shape[0] - 1)

    example, feed = torch.arange(4), torch.tensor([0, 3, 7, 2, 9])
    for module, refused in ((Clamped(), {"clamp"}), (Bounded(), set())):
        traced = torch.jit.trace(module, (example,))
        tags = DeviceTags()
        tags.mark([feed])
        with tags, torch.inference_mode():
            got = traced(feed)
        assert got.tolist() == [0, 3, 4, 2, 4]
        assert {operator for operator, _ in tags.refused} == refused


def test_an_eager_graph_evaluates_a_training_module_and_leaves_a_served_one_alone() -> None:
    """A module lent mid-training runs with dropout off and goes back to training; a module in
    eval mode (as every served one is loaded) is run as it is, its submodules never revisited."""
    import torch

    from nerserve.ner.torch_graph import EagerGraph

    module = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.9))
    graph = EagerGraph(module, ("x",), ("y",))
    feed = {"x": np.ones((8, 4), dtype=np.float32)}
    first, second = graph.run(feed)["y"], graph.run(feed)["y"]
    np.testing.assert_array_equal(first, second)  # dropout was off
    assert all(m.training for m in module.modules())

    visits: list[bool] = []
    module.eval()
    module.train = lambda mode=True: visits.append(mode) or module  # type: ignore[method-assign]
    np.testing.assert_array_equal(graph.run(feed)["y"], first)
    assert visits == []


@pytest.mark.parametrize("model", ["span-conll03", "diffusion-conll03"])
def test_a_model_loaded_in_half_precision_has_half_weights_and_finds_what_fp32_finds(model: str, data_root: Path) -> None:
    """--precision converts the weights once at load (no autocast): every floating-point weight is
    half, the graphs take their float feeds in it (diffusion's sinusoids included), and the entity
    sets of CoNLL-2003 test sentences are fp32's nearly everywhere. (fp16 runs on the CPU too,
    slowly: the same graphs a GPU runs.)"""
    import torch

    from nerserve.ner.data import read_split
    from nerserve.ner.loading import load_model
    from nerserve.ner.model_store import Locations

    folder = Locations().model_dir(model)
    full = load_model(folder, "cpu", merged=True)
    half = load_model(folder, "cpu", precision="fp16", merged=True)
    weights = [p for p in half.network.parameters() if p.is_floating_point()]
    assert weights and all(p.dtype == torch.float16 for p in weights)
    sentences = [list(s.tokens) for s in read_split(data_root / "conll03", "test", 32)]
    expected, found = full.program.predict(sentences), half.program.predict(sentences)
    assert sum(len(entities) for entities in found) >= 0.9 * sum(len(entities) for entities in expected) > 0
    assert sum(a == b for a, b in zip(expected, found, strict=True)) >= 0.9 * len(sentences)


def test_a_launch_bound_pass_holds_the_interpreter_for_its_launching() -> None:
    """A table with `host_ms` (eager torch launching a pass's kernels from Python): the pass spends
    that much of its thread's CPU time, so two lanes launching at once take turns on the interpreter
    and each pass ends no sooner than its launching, while the device's share alone is its busy time."""
    from nerserve.ner.runtime.simulated import SimulatedDevice

    device = SimulatedDevice.from_file(Path("h200-span-conll03-launch-bound.json"))
    assert "H200" in device.card and "simulated" in device.card
    assert device.launch_seconds(19) == pytest.approx(0.00302) and device.batch_seconds(19) == pytest.approx(0.000941)
    launch_bound = SimulatedDevice("card", "test", np.array([1.0, 100.0]), np.array([10.0, 10.0]), np.array([60.0, 60.0]))
    cpu: list[float] = []

    def pass_on_a_lane() -> None:
        started = time.thread_time()
        launch_bound.run(10)
        cpu.append(time.thread_time() - started)

    started = time.perf_counter()
    lanes = [threading.Thread(target=pass_on_a_lane) for _ in range(2)]
    for lane in lanes:
        lane.start()
    for lane in lanes:
        lane.join()
    assert time.perf_counter() - started >= 0.12  # two launchings of 60 ms, one interpreter
    assert min(cpu) >= 0.06
    assert launch_bound.passes == 2 and launch_bound.busy_seconds == pytest.approx(0.02)


def test_a_cost_table_gives_the_launching_for_every_point_or_none(tmp_path: Path) -> None:
    from nerserve.ner.graph import GraphError
    from nerserve.ner.runtime.simulated import SimulatedDevice

    table = tmp_path / "costs.json"
    table.write_text(
        '{"card": "c", "source": "s", "points": [{"subwords": 1, "ms": 1, "host_ms": 2}, {"subwords": 2, "ms": 2}]}'
    )
    with pytest.raises(GraphError, match="host_ms"):
        SimulatedDevice.from_file(table)


def test_host_feeds_of_one_dtype_go_up_together_and_come_apart_unchanged() -> None:
    """A pass's host feeds go to a GPU packed by dtype (`torch_graph.upload_by_dtype`): one buffer,
    one copy, a view for each feed. Followed here on the CPU without pinning: every feed comes back
    with its dtype, shape and values (empty and strided ones too), and the feeds of one dtype share
    one buffer."""
    import torch

    from nerserve.ner.torch_graph import upload_by_dtype

    feeds = [
        np.arange(12).reshape(3, 4),
        np.zeros((0, 3), dtype=np.int64),
        np.ones((2, 2), dtype=bool),
        np.array([0.25, 0.5, 0.75], dtype=np.float32),
        np.arange(6).reshape(2, 3)[:, ::2],
    ]
    uploaded = upload_by_dtype(feeds, torch.device("cpu"), pin=False)
    for sent, received in zip(feeds, uploaded, strict=True):
        sent_tensor = torch.from_numpy(np.ascontiguousarray(sent))
        assert received.dtype == sent_tensor.dtype and received.shape == sent_tensor.shape
        assert torch.equal(received, sent_tensor)
    int64 = [received for received in uploaded if received.dtype == torch.int64]
    assert len(int64) == 3 and len({received.untyped_storage().data_ptr() for received in int64}) == 1


def test_a_feed_already_as_the_graph_takes_it_is_passed_on_untouched() -> None:
    """`torch_graph.as_fed`: a tensor on the graph's device in the graph's dtype is handed on as it is,
    without a call into torch (each lets the interpreter lock go, which a launch-bound pass on a GPU
    must then wait to get back); otherwise it is moved or cast, floats alone to half precision."""
    import torch

    from nerserve.ner.torch_graph import as_fed, to_tensors

    cpu = torch.device("cpu")
    ids, scores = torch.arange(4), torch.ones(3)
    assert as_fed(ids, cpu, None) is ids and as_fed(scores, cpu, None) is scores
    assert as_fed(ids, cpu, torch.float16) is ids
    halved = as_fed(scores, cpu, torch.float16)
    assert halved.dtype == torch.float16 and torch.equal(halved.float(), scores)
    fed = to_tensors([np.arange(3), scores], cpu, torch.bfloat16)
    assert fed[0].dtype == torch.int64 and fed[1].dtype == torch.bfloat16


# What a served eager pass reads back from the device before its outputs, each read a wait of the
# host for the device, after which the device idles while the rest is launched: span's filter
# verdict only (how many seeds it passed decides which rows leave the graph), read once all the
# proposal's work is launched, and followed only by the selection of its outputs. The rest the
# graphs work out from their feeds' host arrays (torch_graph.host_array_of): span's real seeds and
# words' rows, the BiLSTM's packed lengths. gner-open is not on the list: its backbone's own
# padding-mask check (transformers') reads one value.
HOST_READS_PER_PASS = {
    "span-conll03": {"nonzero": 1},
    "span-genia": {"nonzero": 1},
    "nag-conll03": {},
    "setgen-conll03": {},
    "bartner-conll03": {},
    "diffusion-conll03": {},
    "gliner-open": {},
}
SPAN_AFTER_ITS_READ = {"squeeze": 1, "index_select": 3}


@pytest.mark.parametrize(
    ("model", "traced_heads"), [(model, False) for model in sorted(HOST_READS_PER_PASS)] + [("span-conll03", True)]
)
def test_a_served_eager_pass_waits_for_the_device_only_once_its_work_is_launched(
    model: str, traced_heads: bool, data_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nerserve.ner.data import read_split
    from nerserve.ner.loading import load_model
    from nerserve.ner.model_store import Locations
    from tests.device_tags import host_reads_of_a_pass

    sentences = [list(s.tokens) for s in read_split(data_root / "conll03", "test", 12)]
    program = load_model(Locations().model_dir(model), "cpu", merged=True, traced_heads=traced_heads).program
    tags = host_reads_of_a_pass(program, sentences, monkeypatch)
    assert dict(tags.host_reads) == HOST_READS_PER_PASS[model]
    assert dict(tags.after_a_read) == (SPAN_AFTER_ITS_READ if tags.host_reads else {})
