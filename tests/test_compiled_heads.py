"""The eager runtime's compiled heads (ner.compiled_heads): each word encoder's inputs to its BiLSTM,
and span's proposal from its indices on, compiled by torch.compile at load for dynamic shapes,
answering as the eager graphs do, at every batch size without compiling again once loaded; a
compiled program that answers otherwise, or that cannot be compiled, is a load error. On the CPU
here (inductor's C++ kernels); their point is a GPU's kernel launches."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch._dynamo.utils import counters

from nerserve.ner import compiled_heads
from nerserve.ner.graph import GraphError
from nerserve.ner.loading import load_model
from nerserve.ner.model_store import Locations
from tests.test_traced_heads import test_sentences

LOCATIONS = Locations()


def test_compiled_heads_find_what_the_eager_graphs_find_without_compiling_again(data_root: Path) -> None:
    plain = load_model(LOCATIONS.model_dir("span-conll03"), "cpu", merged=True).program
    graphs_before = counters["stats"]["unique_graphs"]
    compiled = load_model(LOCATIONS.model_dir("span-conll03"), "cpu", merged=True, compiled_heads=True).program
    assert compiled.graphs["encoder"].execution_provider.endswith(", lstm_inputs compiled")
    assert compiled.graphs["span_proposal"].execution_provider.endswith(", fused_forward compiled")
    graphs_at_load = counters["stats"]["unique_graphs"]
    assert graphs_at_load > graphs_before  # compiled at load, on the check sentences
    sentences = [*test_sentences(data_root, 96), ["Germany"], ["Peace", "."]]
    for size in (1, 7, 32, 2):  # other batch, word and sub-word counts than the checks at load
        for start in range(0, len(sentences), size):
            batch = sentences[start : start + size]
            assert compiled.predict(batch) == plain.predict(batch)
    assert counters["stats"]["unique_graphs"] == graphs_at_load  # each size compiled at load already


def wrong(method: Callable[..., Any]) -> Callable[..., Any]:
    def each_word_given_another_words_inputs(*inputs: torch.Tensor) -> Any:
        outputs = method(*inputs)
        return outputs.flip(1) if method.__name__ == "lstm_inputs" else outputs

    return each_word_given_another_words_inputs


def failing(method: Callable[..., Any]) -> Callable[..., Any]:
    def without_a_compiler(*inputs: torch.Tensor) -> Any:
        raise RuntimeError("InvalidCxxCompiler: No working C++ compiler found")

    return without_a_compiler


def test_a_compiled_program_that_answers_otherwise_is_a_load_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compiled_heads, "compiled", wrong)
    with pytest.raises(GraphError, match=r"changed the entities of \d+ of 6 check sentences; serve without --compiled-heads"):
        load_model(LOCATIONS.model_dir("span-conll03"), "cpu", merged=True, compiled_heads=True)


def test_a_device_torch_compile_cannot_compile_for_is_a_load_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compiled_heads, "compiled", failing)
    said = r"torch.compile could not compile the graphs on cpu \(RuntimeError: InvalidCxxCompiler: .*--compiled-heads"
    with pytest.raises(GraphError, match=said):
        load_model(LOCATIONS.model_dir("span-conll03"), "cpu", merged=True, compiled_heads=True)


def test_compiled_heads_are_the_eager_runtimes_and_not_traced_too() -> None:
    from pydantic import ValidationError

    from nerserve.service.config import Settings

    assert Settings(runtime="eager", compiled_heads=True).compiled_heads
    with pytest.raises(ValidationError, match="compiled_heads compiles the eager runtime's graphs"):
        Settings(runtime="onnx", compiled_heads=True)
    with pytest.raises(ValidationError, match=r"traced .* or compiled .*, not both"):
        Settings(runtime="eager", compiled_heads=True, traced_heads=True)
    with pytest.raises(ValueError, match="traced or compiled, not both"):
        load_model(LOCATIONS.model_dir("span-conll03"), "cpu", merged=True, compiled_heads=True, traced_heads=True)
