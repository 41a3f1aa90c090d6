"""The openvino runtime (`--runtime openvino [--precision bf16]`): the ONNX export compiled by
OpenVINO on the CPU, computing what ONNX Runtime computes in fp32, in bf16 only where the CPU has
bf16 instructions, refused where it cannot run, and served."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import numpy as np
import pytest
from pydantic import ValidationError

from nerserve.ner.archs.registry import architecture
from nerserve.ner.data import named_split, read_split
from nerserve.ner.graph import GraphError
from nerserve.ner.graph_format import Runtime
from nerserve.ner.model_store import read_manifest
from nerserve.ner.runtime import DeviceUnavailable, resolve_device
from nerserve.ner.runtime.graph_set import load_graph_set
from nerserve.ner.runtime.openvino import OpenVinoGraph, _precision_refusal, cpu_precision_refusal
from nerserve.service.config import Settings
from tests.serving import LOCATIONS, Server, onnx_graphs

MODEL = "span-conll03"
CPU_HAS_BF16 = cpu_precision_refusal("bf16") is None


def dev_sentences(data_root: Path, limit: int) -> list[list[str]]:
    return [list(s.tokens) for s in read_split(data_root / "conll03", "dev", limit)]


def entity_sets(program: object, sentences: list[list[str]], batch: int = 16) -> list[list[tuple[object, ...]]]:
    found = []
    for start in range(0, len(sentences), batch):
        for entity_set in program.predict(sentences[start : start + batch]):  # type: ignore[attr-defined]
            found.append(sorted((e.type, *e.fragments) for e in entity_set))
    return found


def test_fp32_computes_what_onnx_runtime_computes(data_root: Path) -> None:
    folder = onnx_graphs(MODEL)
    by_onnx_runtime = load_graph_set(folder, threads=1).program
    by_openvino = load_graph_set(folder, threads=1, runtime=Runtime.openvino).program
    assert set(by_openvino.graphs) == set(by_onnx_runtime.graphs)
    assert {graph.execution_provider for graph in by_openvino.graphs.values()} == {"OpenVINO CPU (fp32)"}
    sentences = dev_sentences(data_root, 64)
    batch = by_onnx_runtime.prepare(sentences[:16])
    expected, got = by_onnx_runtime.run(batch), by_openvino.run(batch)
    assert set(got) == set(expected)
    for name, value in expected.items():
        np.testing.assert_allclose(got[name], value, atol=1e-4, err_msg=name)
    assert entity_sets(by_openvino, sentences) == entity_sets(by_onnx_runtime, sentences)


def test_a_decoder_loop_gets_its_outputs_by_their_graph_names(data_root: Path) -> None:
    """OpenVINO names a graph output that is also a node's output twice, in no set order (gner's
    decoder: `logits` and `/Squeeze_output_0`): each output keeps the name its signature gives it,
    and the step loop finds what ONNX Runtime's finds."""
    name = "gner-open"
    folder = onnx_graphs(name)
    spec = architecture(read_manifest(folder).architecture)
    signatures = spec.signatures(spec.config_from(read_manifest(folder).config))
    by_openvino = load_graph_set(folder, threads=1, runtime=Runtime.openvino).program
    for graph_name, signature in signatures.items():
        assert set(by_openvino.graphs[graph_name].output_names) == set(signature.outputs), graph_name
    by_onnx_runtime = load_graph_set(folder, threads=1).program
    dev, labels = named_split(data_root / read_manifest(LOCATIONS.model_dir(name)).data["folder"], "dev", 6)
    options = replace(by_onnx_runtime.config.decode, labels=labels)
    sentences = [list(s.tokens) for s in dev]
    assert by_openvino.predict(sentences, options) == by_onnx_runtime.predict(sentences, options)


@pytest.mark.skipif(not CPU_HAS_BF16, reason="this CPU has no bf16 instructions (the refusal is tested instead)")
def test_bf16_finds_fp32s_entities_on_this_cpu(data_root: Path) -> None:
    folder = onnx_graphs(MODEL)
    fp32 = load_graph_set(folder, threads=1, runtime=Runtime.openvino).program
    bf16 = load_graph_set(folder, threads=1, runtime=Runtime.openvino, precision="bf16").program
    assert {graph.execution_provider for graph in bf16.graphs.values()} == {"OpenVINO CPU (bf16)"}
    sentences = dev_sentences(data_root, 200)
    agreeing = sum(a == b for a, b in zip(entity_sets(bf16, sentences), entity_sets(fp32, sentences), strict=True))
    assert agreeing / len(sentences) >= 0.97  # the whole test split agreed on 99.8 % (docs/decisions/cpu-inference.md)


@pytest.mark.skipif(CPU_HAS_BF16, reason="this CPU has bf16 instructions (what it computes is tested instead)")
def test_bf16_is_refused_on_a_cpu_without_it() -> None:
    with pytest.raises(GraphError, match="no bf16 instructions"):
        OpenVinoGraph(onnx_graphs(MODEL) / "encoder.onnx", ("word_states",), precision="bf16")
    with pytest.raises(DeviceUnavailable, match="--precision bf16: this CPU has no bf16 instructions"):
        resolve_device("cpu", "openvino", "bf16")


class CpuWithout:
    """OpenVINO's Core as a CPU without some instructions answers."""

    def __init__(self, *missing: str) -> None:
        self.capabilities = [c for c in ("FP32", "BF16", "INT8", "EXPORT_IMPORT") if c not in missing]

    def get_property(self, device: str, name: str) -> list[str]:
        assert (device, name) == ("CPU", "OPTIMIZATION_CAPABILITIES")
        return self.capabilities


def test_bf16_is_asked_of_the_cpus_capabilities() -> None:
    assert _precision_refusal(CpuWithout(), "bf16") is None
    assert _precision_refusal(CpuWithout("BF16"), "fp32") is None
    refusal = _precision_refusal(CpuWithout("BF16"), "bf16")
    assert (
        refusal == "this CPU has no bf16 instructions (OpenVINO's CPU capabilities: FP32, INT8, EXPORT_IMPORT): serve in fp32"
    )


def test_openvino_runs_on_the_cpu_only_and_in_fp32_or_bf16() -> None:
    assert resolve_device("cpu", "openvino") == resolve_device("auto", "openvino") == "cpu"
    for device in ("cuda", "cuda:0", "simulated"):
        with pytest.raises(DeviceUnavailable, match="the openvino runtime runs the graphs on the CPU"):
            resolve_device(device, "openvino")
    with pytest.raises(DeviceUnavailable, match="in fp32 or bf16 on the CPU"):
        resolve_device("cpu", "openvino", "fp16")
    assert Settings(runtime="openvino", precision="bf16").served_precision == "bf16"
    assert Settings(runtime="openvino").lanes == Settings(runtime="onnx").lanes
    with pytest.raises(ValidationError, match="precision bf16 runs on CUDA with the eager runtime only"):
        Settings(runtime="onnx", precision="bf16")
    with pytest.raises(ValidationError, match="int8 serves ONNX graphs on the CPU only"):
        Settings(runtime="openvino", int8=True)


def test_a_graph_openvino_cannot_read_is_named() -> None:
    with pytest.raises(GraphError, match="graph file missing"):
        OpenVinoGraph(Path("/nonexistent/encoder.onnx"), ())


def test_serve_openvino_without_openvino_exits_at_once_saying_how_to_install_it() -> None:
    command = "import sys; sys.modules['openvino'] = None\nfrom nerserve.cli import app\napp(['serve'])"
    environment = {**os.environ, "NERSERVE_RUNTIME": "openvino"}
    done = subprocess.run([sys.executable, "-c", command], env=environment, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "pip install 'nerserve[openvino]'" in done.stderr


@pytest.fixture(scope="module")
def openvino_server() -> Iterator[Server]:
    onnx_graphs(MODEL)
    precision = "bf16" if CPU_HAS_BF16 else "fp32"
    server = Server(models=MODEL, runtime="openvino", precision=precision, threads=1, export_missing="false")
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


def test_a_server_serves_openvinos_graphs_and_says_so(openvino_server: Server, data_root: Path) -> None:
    info = httpx.get(f"{openvino_server.url}/info").json()
    precision = "bf16" if CPU_HAS_BF16 else "fp32"
    assert info["runtime"] == "openvino" and info["precision"] == precision
    (model,) = httpx.get(f"{openvino_server.url}/models").json()["models"]
    assert set(model["execution_providers"].values()) == {f"OpenVINO CPU ({precision})"}
    sentences = dev_sentences(data_root, 24)
    served = []
    for words in sentences:  # one at a time: a batch of one sentence, as offline below
        answer = httpx.post(f"{openvino_server.url}/extract", json={"model": MODEL, "tokens": [words]}, timeout=30)
        assert answer.status_code == 200, answer.text
        served.append(sorted((e["type"], *map(tuple, e["token_spans"])) for e in answer.json()["results"][0]["entities"]))
    offline = load_graph_set(onnx_graphs(MODEL), threads=1, runtime=Runtime.openvino, precision=precision).program
    assert served == [entity_sets(offline, [words])[0] for words in sentences]
