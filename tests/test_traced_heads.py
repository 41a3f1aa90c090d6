"""The eager runtime's traced heads (ner.traced_heads): each word encoder's part after the backbone,
and span's proposal from its indices on, traced to TorchScript at load, answering as the eager
graphs do; a trace that answers otherwise is a load error. On the CPU here; their point is a GPU's
interpreter lock. A server says which it runs (its compiled form too: ner.compiled_heads)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import torch

from nerserve.ner.data import read_split
from nerserve.ner.encoder import WordEncoder
from nerserve.ner.graph import GraphError
from nerserve.ner.loading import load_model
from nerserve.ner.model_store import Locations
from nerserve.ner.traced_heads import TracedPart

LOCATIONS = Locations()


def test_sentences(data_root: Path, count: int) -> list[list[str]]:
    sentences = [list(s.tokens) for s in read_split(data_root / "conll03", "test")]
    random.Random(3).shuffle(sentences)
    return sentences[:count]


test_sentences.__test__ = False  # type: ignore[attr-defined]  # a helper, not a test


ENCODER_PART = "its word encoder after the backbone"
PROPOSAL_PART = "its proposal from its indices on"


@pytest.mark.parametrize(
    ("model", "traced_parts"),
    [
        ("span-conll03", {"encoder": ENCODER_PART, "span_proposal": PROPOSAL_PART}),
        ("setgen-conll03", {"encoder": ENCODER_PART}),
    ],
)
def test_traced_heads_find_what_the_eager_graphs_find(model: str, traced_parts: dict[str, str], data_root: Path) -> None:
    plain = load_model(LOCATIONS.model_dir(model), "cpu", merged=True).program
    traced = load_model(LOCATIONS.model_dir(model), "cpu", merged=True, traced_heads=True).program
    for name, graph in traced.graphs.items():
        said = f"{traced_parts[name]} traced to TorchScript" if name in traced_parts else "traced"
        assert (said in graph.execution_provider) == (name in traced_parts), (name, graph.execution_provider)
        # a traced part is called, not held as a submodule: the graph's weights are listed once
        assert not any(isinstance(part, torch.jit.ScriptModule) for part in graph.module.modules())
    sentences = test_sentences(data_root, 96)
    for size in (1, 7, 32):  # other batch, word and sub-word counts than the trace's example
        for start in range(0, len(sentences), size):
            batch = sentences[start : start + size]
            assert traced.predict(batch) == plain.predict(batch)


def test_a_trace_that_answers_otherwise_is_a_load_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def shifted(self: TracedPart, *inputs: torch.Tensor) -> Any:
        outputs = self.method(self.owner, *inputs)
        if not isinstance(self.owner, WordEncoder):
            return outputs
        states, hidden = outputs
        return states.flip(1), hidden  # each word given another's state

    monkeypatch.setattr(TracedPart, "forward", shifted)
    with pytest.raises(GraphError, match=r"changed the entities of \d+ of 5 check sentences; serve without --traced-heads"):
        load_model(LOCATIONS.model_dir("span-conll03"), "cpu", merged=True, traced_heads=True)


@pytest.mark.parametrize("model", ["setgen-conll03", "gner-open"])
def test_every_graph_of_a_model_loaded_for_inference_is_in_eval_mode(model: str) -> None:
    """A graph that wraps parts of the network is made in train mode: served, it would be put in
    eval mode and back at every call (every decoding step), its parts left in train mode between."""
    loaded = load_model(LOCATIONS.model_dir(model), "cpu", merged=True)
    assert not any(part.training for graph in loaded.program.graphs.values() for part in graph.module.modules())


def test_traced_heads_are_the_eager_runtimes() -> None:
    from pydantic import ValidationError

    from nerserve.service.config import Settings

    assert Settings(runtime="eager", traced_heads=True).traced_heads
    with pytest.raises(ValidationError, match="traced_heads traces the eager runtime's graphs"):
        Settings(runtime="onnx", traced_heads=True)


@pytest.mark.parametrize(
    ("heads", "said"), [("traced_heads", "traced to TorchScript"), ("compiled_heads", "fused_forward compiled")]
)
def test_a_server_with_traced_or_compiled_heads_says_so_and_answers_as_without(heads: str, said: str) -> None:
    import httpx

    from tests.serving import Server, assert_same_results

    texts = ["EU rejects German call to boycott British lamb.", "Peter Blackburn lives in Paris.", "Shares rose."]
    answers, providers = [], []
    for on in (True, False):
        server = Server(models="span-conll03", runtime="eager", threads=1, **{heads: on})
        try:
            server.wait_ready()
            answer = httpx.post(f"{server.url}/extract", json={"texts": texts}, timeout=60)
            assert answer.status_code == 200
            answers.append(answer.json()["results"])
            providers.append(httpx.get(f"{server.url}/info").json()["execution_providers"]["span-conll03"])
        finally:
            server.stop()
    assert said in providers[0]["span_proposal"] and said not in providers[1]["span_proposal"]
    assert_same_results(answers[0], answers[1])
