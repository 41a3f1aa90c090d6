"""Serving the INT8 graphs (`nerserve serve --int8`): asked for where they can run, exported at
start-up where missing, reported, and what answers is what the quantised graphs compute."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError

from nerserve.ner.data import read_split
from nerserve.ner.graph_format import EXPORT_JSON, int8_refusal
from nerserve.ner.model_store import Locations
from nerserve.ner.runtime.graph_set import load_graph_set
from nerserve.service.config import Settings
from tests.serving import LOCATIONS, Server, onnx_graphs

MODEL = "span-conll03"


def test_int8_is_for_onnx_graphs_on_the_cpu() -> None:
    assert Settings(int8=True).served_precision == "int8"
    assert Settings().served_precision == "fp32"
    devices = [{"device": device} for device in ("cuda", "cuda:1", "auto", "simulated")]
    for asked in [*devices, {"runtime": "eager"}, {"runtime": "torchscript"}]:
        with pytest.raises(ValidationError, match="int8 serves ONNX graphs on the CPU only"):
            Settings(int8=True, **asked)


def test_serve_int8_on_cuda_exits_at_once_saying_why() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "nerserve", "serve", "--int8", "--device", "cuda"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert "int8 serves ONNX graphs on the CPU only" in done.stderr


def served_entity_set(result: dict[str, list[dict[str, object]]]) -> list[tuple[object, ...]]:
    return sorted((e["type"], *map(tuple, e["token_spans"])) for e in result["entities"])  # type: ignore[call-overload]


def offline_entity_sets(folder: Path, sentences: list[list[str]]) -> list[list[tuple[object, ...]]]:
    """Each sentence alone through the graph set in FOLDER, as the service answers a lone request:
    dynamic INT8 scales a product by the range of its batch, so only equal batches compare."""
    program = load_graph_set(folder, threads=1).program
    found = []
    for words in sentences:
        (entity_set,) = program.predict([words])
        found.append(sorted((e.type, *e.fragments) for e in entity_set))
    return found


@pytest.fixture(scope="module")
def int8_server(tmp_path_factory: pytest.TempPathFactory, data_root: Path) -> Iterator[tuple[Server, Locations]]:
    """A server asked for INT8 with a graph cache of its own, empty: it exports the INT8 graphs at start-up."""
    cache = tmp_path_factory.mktemp("graphs")
    locations = Locations(model_store=LOCATIONS.model_store, graph_cache=cache, data_root=data_root)
    server = Server(models=MODEL, int8="true", threads=1, graph_lanes=1, graph_cache=cache)
    try:
        server.wait_ready()
        yield server, locations
    finally:
        server.stop()


def test_a_server_asked_for_int8_exports_and_serves_the_quantised_graphs(
    int8_server: tuple[Server, Locations], data_root: Path
) -> None:
    server, locations = int8_server
    int8_folder = locations.graph_set_folder(MODEL, "onnx", int8=True)
    export = json.loads((int8_folder / EXPORT_JSON).read_text())
    assert export["int8"] and export["ready"] and "encoder" in export["int8_graphs"]
    assert not locations.graph_set_folder(MODEL, "onnx").exists()  # fp32's were neither needed nor made
    assert httpx.get(f"{server.url}/info").json()["precision"] == "int8"
    (model,) = httpx.get(f"{server.url}/models").json()["models"]
    assert model["precision"] == "int8"

    sentences = [list(s.tokens) for s in read_split(data_root / "conll03", "dev")][:160]
    served = []
    for words in sentences:  # one at a time: a batch of one sentence, as offline below
        response = httpx.post(f"{server.url}/extract", json={"model": MODEL, "tokens": [words]}, timeout=30)
        assert response.status_code == 200, response.text
        served.append(served_entity_set(response.json()["results"][0]))
    quantised = offline_entity_sets(int8_folder, sentences)
    full = offline_entity_sets(onnx_graphs(MODEL), sentences)
    differing = [i for i, (a, b) in enumerate(zip(quantised, full, strict=True)) if a != b]
    # what answers is the quantised graphs' own result, which is not fp32's on some sentences...
    assert served == quantised
    assert differing, "INT8 and fp32 agree on every sentence: the comparison cannot tell them apart"
    # ...and agrees with fp32's on nearly all (span-conll03: test F1 0.003 lower: docs/decisions/cpu-inference.md)
    assert len(differing) <= len(sentences) // 10


def test_int8_graphs_that_lost_fp32s_entity_sets_are_refused() -> None:
    parity = {"sentences": 32, "sentences_differing": 16}
    assert int8_refusal({"parity": parity}) is None
    refusal = int8_refusal({"parity": {**parity, "sentences_differing": 17}})
    assert refusal is not None and "on 47% of the export's 32 parity sentences" in refusal
    assert int8_refusal({"parity": {}}) == "its export checked no sentences against fp32"


def test_a_server_refuses_int8_graphs_far_from_fp32_naming_the_model(
    int8_server: tuple[Server, Locations], tmp_path: Path, data_root: Path
) -> None:
    _, locations = int8_server
    exported = locations.graph_set_folder(MODEL, "onnx", int8=True)
    cache = tmp_path / "graphs"
    copied = Locations(model_store=LOCATIONS.model_store, graph_cache=cache, data_root=data_root)
    folder = copied.graph_set_folder(MODEL, "onnx", int8=True)
    shutil.copytree(exported, folder)
    info = json.loads((folder / EXPORT_JSON).read_text())
    info["parity"]["sentences_differing"] = info["parity"]["sentences"]  # as a quantisation that broke the model
    (folder / EXPORT_JSON).write_text(json.dumps(info))
    server = Server(models=MODEL, int8="true", threads=1, graph_cache=cache)
    try:
        server.process.wait(timeout=120)
    finally:
        server.stop()
    assert server.process.returncode not in (0, None)
    stderr = server.process.stderr.read().decode()  # type: ignore[union-attr]
    assert f"{MODEL}: its INT8 graphs find fp32's entity sets on 0% of the export's" in stderr
