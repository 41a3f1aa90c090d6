"""The contract for decoders that loop: a decoder-step graph with a key/value cache, its signature
built from the config (cache names only for the layers it has), exported to ONNX and TorchScript
with a cache axis that may be empty, and run step by step by the shared greedy loop. Parity is per
step: logits within 1e-4 and identical greedy token sequences, from an empty cache on.

The step module is a tiny random transformer decoder written for this test (shapes and export only:
the architectures that loop bring their own trained decoders)."""

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from nerserve.export.parity import ParityReport
from nerserve.export.writers import DYNAMO, write_onnx, write_torchscript
from nerserve.ner.decoding.generation import Generated, Hypothesis, Loop, beam_search, greedy
from nerserve.ner.graph import GraphSignature, KeyValueCache, step_signature
from nerserve.ner.runtime.onnx import OnnxGraph
from nerserve.ner.runtime.torchscript import TorchScriptGraph
from nerserve.ner.torch_graph import EagerGraph

VOCAB, DIM, HEADS, END = 13, 16, 2, 2


def toy_signature(layers: int) -> GraphSignature:
    cache = KeyValueCache(layers, HEADS, DIM // HEADS)
    axes = {
        "memory": ("rows", "memory", ""),
        "memory_mask": ("rows", "memory"),
        "tokens": ("rows",),
        "positions": ("rows",),
        "logits": ("rows", ""),
    }
    return step_signature(("memory", "memory_mask", "tokens", "positions"), ("logits",), axes, cache)


class ToyStep(nn.Module):
    """One decoding step: self-attention over the cached positions + this one, cross-attention
    to the memory, next-token logits; returns the cache grown by one position per layer."""

    def __init__(self, layers: int) -> None:
        super().__init__()
        self.layers = layers
        self.embed = nn.Embedding(VOCAB, DIM)
        self.position = nn.Embedding(64, DIM)
        self.qkv = nn.ModuleList(nn.Linear(DIM, 3 * DIM) for _ in range(layers))
        self.cross = nn.ModuleList(nn.MultiheadAttention(DIM, HEADS, batch_first=True) for _ in range(layers))
        self.out = nn.Linear(DIM, VOCAB)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(x.shape[0], -1, HEADS, DIM // HEADS).transpose(1, 2)

    def forward(self, memory, memory_mask, tokens, positions, *past):  # type: ignore[no-untyped-def]
        x = (self.embed(tokens) + self.position(positions)).unsqueeze(1)  # [R, 1, D]
        present = []
        for i in range(self.layers):
            q, k, v = self.qkv[i](x).chunk(3, dim=-1)
            keys = torch.cat([past[2 * i], self._heads(k)], dim=2)
            values = torch.cat([past[2 * i + 1], self._heads(v)], dim=2)
            present += [keys, values]
            attended = torch.softmax(self._heads(q) @ keys.transpose(-1, -2) / (DIM // HEADS) ** 0.5, dim=-1) @ values
            x = x + attended.transpose(1, 2).reshape(x.shape)
            crossed, _ = self.cross[i](x, memory, memory, key_padding_mask=memory_mask == 0, need_weights=False)
            x = x + crossed
        return (self.out(x[:, 0]), *present)


def example_args(signature: GraphSignature, rows: int = 4, memory: int = 5, past: int = 3) -> tuple[torch.Tensor, ...]:
    """Every named axis at a size of 2 or more and distinct from the others (torch.export)."""
    torch.manual_seed(1)
    mask = torch.ones(rows, memory)
    mask[0, -2:] = 0
    fixed = [torch.randn(rows, memory, DIM), mask, torch.randint(0, VOCAB, (rows,)), torch.full((rows,), past)]
    cache = [torch.randn(rows, HEADS, past, DIM // HEADS) for _ in signature.inputs[4:]]
    return (*fixed, *cache)


def generate(graph, signature: GraphSignature, layers: int, rows: int = 3) -> Generated:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(0)
    memory_mask = np.ones((rows, 7), dtype=np.float32)
    memory_mask[1, 4:] = 0
    fixed = {"memory": rng.standard_normal((rows, 7, DIM)).astype(np.float32), "memory_mask": memory_mask}
    cache = KeyValueCache(layers, HEADS, DIM // HEADS)
    return greedy(Loop(graph, fixed, {}, cache, np.ones(rows, dtype=np.int64), END), max_steps=9, keep_logits=True)


class ToyStepReordering(ToyStep):
    """ToyStep that takes `cache_order` and reorders its cache itself (what a step graph that
    reorders inside does)."""

    def forward(self, memory, memory_mask, tokens, positions, cache_order, *past):  # type: ignore[no-untyped-def]
        return super().forward(memory, memory_mask, tokens, positions, *(p.index_select(0, cache_order) for p in past))


def beams_of(graph, layers: int, reorder=None) -> list[list[Hypothesis]]:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(0)
    rows, beams = 2, 3
    per_row = {  # beam search repeats them for each row's beams
        "memory": rng.standard_normal((rows, 7, DIM)).astype(np.float32),
        "memory_mask": np.ones((rows, 7), dtype=np.float32),
    }
    cache = KeyValueCache(layers, HEADS, DIM // HEADS)
    loop = Loop(graph, {}, per_row, cache, np.ones(rows, dtype=np.int64), END, reorder=reorder)
    return beam_search(loop, max_steps=9, beams=beams, keep=np.full(rows, beams))


def same_hypotheses(found: list[list[Hypothesis]], expected: list[list[Hypothesis]]) -> bool:
    """The same tokens, and scores up to float rounding (a step over fewer rows sums in another order)."""
    return [[h.tokens for h in row] for row in found] == [[h.tokens for h in row] for row in expected] and all(
        np.allclose(h.log_probs, e.log_probs, atol=1e-6)
        for row, rows in zip(found, expected, strict=True)
        for h, e in zip(row, rows, strict=True)
    )


def test_beam_search_reorders_the_cache_of_a_step_graph_that_does_not() -> None:
    """Beam search continues each hypothesis from its own cache whether the step graph reorders
    the cache (`cache_order`) or the loop's `reorder` does, between steps."""
    torch.manual_seed(0)
    module = ToyStepReordering(layers=2).eval()
    signature = toy_signature(2)
    inputs = (*signature.inputs[:4], "cache_order", *signature.inputs[4:])
    inside = beams_of(EagerGraph(module, inputs, signature.outputs), 2)
    same_weights = ToyStep(layers=2).eval()
    same_weights.load_state_dict(module.state_dict())
    plain = EagerGraph(same_weights, signature.inputs, signature.outputs)

    assert same_hypotheses(beams_of(plain, 2, take_rows), inside)
    assert not same_hypotheses(beams_of(plain, 2, lambda order, cache: dict(cache)), inside)  # the order matters here
    with pytest.raises(ValueError, match="cache_order, or the loop's reorder"):
        beams_of(plain, 2)


class OddTokens:
    """Candidates: odd tokens only (the end is even), then the end from the fourth token on."""

    def candidates(self, history: np.ndarray) -> list[list[int]]:
        allowed = [END] if history.shape[1] > 3 else list(range(1, VOCAB, 2))
        return [allowed for _ in history]


def test_candidates_constrain_a_step_graph_that_scores_every_token() -> None:
    torch.manual_seed(0)
    signature = toy_signature(2)
    graph = EagerGraph(ToyStep(layers=2).eval(), signature.inputs, signature.outputs)
    rng = np.random.default_rng(0)
    fixed = {"memory": rng.standard_normal((3, 7, DIM)).astype(np.float32), "memory_mask": np.ones((3, 7), dtype=np.float32)}
    cache = KeyValueCache(2, HEADS, DIM // HEADS)
    loop = Loop(graph, fixed, {}, cache, np.ones(3, dtype=np.int64), END, constraint=OddTokens())
    generated = greedy(loop, max_steps=9)
    assert generated.finished.all() and generated.tokens.shape[1] == 4
    assert np.all(generated.tokens[:, :3] % 2 == 1) and np.all(generated.tokens[:, 3] == END)
    assert np.all(generated.log_probs[:, 3] == 0)  # the only token allowed: probability 1


class ToyStepScoringVocabulary(ToyStep):
    """ToyStep that takes a `vocabulary` and answers the scores of those tokens only."""

    def forward(self, memory, memory_mask, tokens, positions, vocabulary, *past):  # type: ignore[no-untyped-def]
        logits, *present = super().forward(memory, memory_mask, tokens, positions, *past)
        return (logits.index_select(1, vocabulary), *present)


class FewTokens:
    """Candidates: one token for three steps (fewer than the beams), then three, then the end; a
    row whose last token is one that fills a beam short of allowed continuations may write only
    the end."""

    def candidates(self, history: np.ndarray) -> list[list[int]]:
        step = history.shape[1]
        usual = [END] if step > 5 else [7] if step < 4 else [3, 5, 11]
        return [[END] if row[-1] == 0 or (step > 1 and row[-1] == 1) else usual for row in history]


def test_beam_search_over_a_vocabulary_is_beam_search_over_every_token() -> None:
    """A step that scores only the candidates gives beam search the hypotheses, order and scores it
    gets when the step scores every token, also where a row has fewer allowed continuations than
    beams."""
    torch.manual_seed(0)
    every = ToyStep(layers=2).eval()
    some = ToyStepScoringVocabulary(layers=2).eval()
    some.load_state_dict(every.state_dict())
    signature = toy_signature(2)
    inputs = (*signature.inputs[:4], "vocabulary", *signature.inputs[4:])

    def beams(graph: Any) -> list[list[Hypothesis]]:
        rng = np.random.default_rng(0)
        memory = rng.standard_normal((6, 7, DIM)).astype(np.float32)
        fixed = {"memory": memory, "memory_mask": np.ones((6, 7), dtype=np.float32)}
        cache = KeyValueCache(2, HEADS, DIM // HEADS)

        def take_rows(order: np.ndarray, cache: Any) -> dict[str, Any]:
            return {name: value[order] for name, value in cache.items()}

        loop = Loop(graph, fixed, {}, cache, np.ones(2, dtype=np.int64), END, constraint=FewTokens(), reorder=take_rows)
        return beam_search(loop, max_steps=9, beams=3, keep=np.full(2, 3))

    expected = beams(EagerGraph(every, signature.inputs, signature.outputs))
    got = beams(EagerGraph(some, inputs, signature.outputs))
    assert [[h.tokens for h in row] for row in got] == [[h.tokens for h in row] for row in expected]
    for got_row, expected_row in zip(got, expected, strict=True):
        for a, b in zip(got_row, expected_row, strict=True):
            np.testing.assert_allclose(a.log_probs, b.log_probs, rtol=1e-5)


@pytest.mark.parametrize("layers", [1, 3])
def test_signature_names_only_the_configured_layers(layers: int) -> None:
    signature = toy_signature(layers)
    assert [n for n in signature.inputs if n.startswith("past_")] == [
        f"past_{kind}_{i}" for i in range(layers) for kind in ("key", "value")
    ]
    assert signature.outputs[1:] == tuple(f"present_{kind}_{i}" for i in range(layers) for kind in ("key", "value"))
    assert signature.may_be_empty == frozenset({"past"})


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[ToyStep, GraphSignature, Path, Path]:
    torch.manual_seed(0)
    module = ToyStep(layers=2).eval()
    signature = toy_signature(2)
    folder = tmp_path_factory.mktemp("toy-step")
    other_sizes = example_args(signature, rows=6, memory=7, past=2)
    exporter = write_onnx(module, example_args(signature), folder / "step.onnx", signature, check_args=other_sizes)
    # its attention reshapes by Python ints, which a trace keeps as constants: caught, exported by torch.export
    assert exporter == DYNAMO
    write_torchscript(module, example_args(signature), folder / "step.pt", signature)
    return module, signature, folder / "step.onnx", folder / "step.pt"


def test_empty_cache_is_a_legal_first_step(exported) -> None:  # type: ignore[no-untyped-def]
    _, signature, onnx_path, _ = exported
    graph = OnnxGraph(onnx_path)
    feeds = {name: arg.numpy() for name, arg in zip(signature.inputs, example_args(signature, past=0), strict=True)}
    outputs = graph.run(feeds)
    assert outputs["logits"].shape == (4, VOCAB)
    assert outputs["present_key_0"].shape == (4, HEADS, 1, DIM // HEADS)  # the cache grew from 0 to 1


def test_exported_loops_match_eager_step_by_step(exported) -> None:  # type: ignore[no-untyped-def]
    module, signature, onnx_path, torchscript_path = exported
    reference = generate(EagerGraph(module, signature.inputs, signature.outputs), signature, 2)
    assert reference.tokens.shape[1] > 1  # several steps, so the cache was carried
    runtimes = {
        "onnx": OnnxGraph(onnx_path),
        "onnx-io-binding": OnnxGraph(onnx_path, io_binding=True),  # the GPU path's code, here on CPU
        "torchscript": TorchScriptGraph(torchscript_path),
    }
    for name, graph in runtimes.items():
        got = generate(graph, signature, 2)
        report = ParityReport()
        report.add_outputs(
            {"tokens": reference.tokens, "logits": reference.logits}, {"tokens": got.tokens, "logits": got.logits}
        )
        assert report.integer_mismatches == 0 and not report.shape_mismatches, name
        assert report.max_abs_diff <= 1e-4, (name, report.max_abs_diff)


def test_io_binding_keeps_the_cache_as_runtime_values(exported) -> None:  # type: ignore[no-untyped-def]
    import onnxruntime as ort

    _, signature, onnx_path, _ = exported
    graph = OnnxGraph(onnx_path, io_binding=True)
    feeds = {name: arg.numpy() for name, arg in zip(signature.inputs, example_args(signature), strict=True)}
    outputs = graph.run(feeds, keep_on_device=KeyValueCache(2, HEADS, DIM // HEADS).present)
    assert isinstance(outputs["present_key_1"], ort.OrtValue) and isinstance(outputs["logits"], np.ndarray)
    plain = OnnxGraph(onnx_path).run(feeds)
    np.testing.assert_allclose(outputs["present_key_1"].numpy(), plain["present_key_1"], atol=1e-6)


def test_parity_fails_on_a_diverging_sequence() -> None:
    report = ParityReport(strict_integers=True)
    tokens = np.array([[4, 5, END]])
    report.add_outputs({"tokens": tokens}, {"tokens": np.array([[4, 6, END]])})
    assert report.integer_mismatches == 1 and not report.passed()
    shorter = ParityReport(strict_integers=True)
    shorter.add_outputs({"tokens": tokens}, {"tokens": np.array([[4, END]])})  # ended a step early
    assert shorter.shape_mismatches and not shorter.passed()


def test_scores_after_a_differing_decision_are_not_compared() -> None:
    """A span rounded the other way: its class scores belong to another span. They are left out
    (and counted); every other row is still held to the tolerance."""
    spans = np.array([[[0, 2], [3, 4]]])
    flipped = np.array([[[0, 2], [3, 5]]])
    scores = np.array([[[0.9, 0.1], [0.5, 0.5]]], dtype=np.float32)
    other = scores.copy()
    other[0, 1] = [0.2, 0.8]  # the flipped span's scores
    report = ParityReport()
    report.add_outputs({"spans": spans, "class_probs": scores}, {"spans": flipped, "class_probs": other})
    assert report.integer_mismatches == 1 and report.rows_not_compared == 1 and report.max_abs_diff == 0.0
    assert report.passed()  # entity sets identical (not strict): allowed, and reported
    other[0, 0, 0] = 0.8  # a row that did not flip still counts
    again = ParityReport()
    again.add_outputs({"spans": spans, "class_probs": scores}, {"spans": flipped, "class_probs": other})
    assert again.max_abs_diff > 0.09 and not again.passed()


def test_large_outputs_are_held_to_a_relative_bound() -> None:
    """4e-4 off a key of magnitude 20 is float32 noise (2e-5 of it) and passes; 1.5e-4 on values
    near 0 (log-probabilities, scores) is out of tolerance; 1.5e-3 off the key is not noise."""
    keys = np.full((2, 3), 20.0, dtype=np.float32)
    log_probs = np.full((2, 3), -0.5, dtype=np.float32)
    report = ParityReport()
    report.add_outputs({"key": keys, "log_probs": log_probs}, {"key": keys + 4e-4, "log_probs": log_probs})
    assert report.allowed("key") == pytest.approx(1e-3) and report.allowed("log_probs") == 1e-4
    assert report.passed()
    report.add_outputs({"key": keys, "log_probs": log_probs}, {"key": keys, "log_probs": log_probs + 1.5e-4})
    assert report.outputs_out_of_tolerance() == {"log_probs"} and not report.passed()
    too_far = ParityReport()
    too_far.add_outputs({"key": keys}, {"key": keys + 1.5e-3})
    assert not too_far.passed()


def test_an_intermediate_is_held_to_its_own_bound_and_its_effect_to_the_outputs_bound() -> None:
    """Word states another graph takes in may differ by a recurrence's rounding (1.3e-4 here); the
    probabilities decoding reads keep 1e-4, and an intermediate off by 1e-3 is not rounding."""
    states = np.full((2, 4), 0.7, dtype=np.float32)
    probs = np.full((2, 3), 0.25, dtype=np.float32)
    report = ParityReport(intermediates=frozenset({"word_states"}))
    report.add_outputs({"word_states": states, "probs": probs}, {"word_states": states + 1.3e-4, "probs": probs})
    assert report.allowed("word_states") == pytest.approx(5e-4) and report.allowed("probs") == 1e-4
    assert report.passed()
    report.add_outputs({"word_states": states, "probs": probs}, {"word_states": states, "probs": probs + 1.3e-4})
    assert report.outputs_out_of_tolerance() == {"probs"}
    too_far = ParityReport(intermediates=frozenset({"word_states"}))
    too_far.add_outputs({"word_states": states}, {"word_states": states + 1e-3})
    assert not too_far.passed()
    assert ParityReport().allowed("word_states") == 1e-4  # an output no graph takes in


class EndAfter:
    """A per-row constraint: row r writes anything but the end until its `limits[r]`-th token, which is the end."""

    def __init__(self, limits: np.ndarray) -> None:
        self.limits = limits

    def __call__(self, logits: np.ndarray, history: np.ndarray) -> np.ndarray:
        at_limit = history.shape[1] >= self.limits
        allowed = np.ones(logits.shape, dtype=bool)
        allowed[:, END] = False
        allowed[at_limit] = False
        allowed[at_limit, END] = True
        return np.where(allowed, logits, -1e9)

    def select(self, rows: np.ndarray) -> "EndAfter":
        return EndAfter(self.limits[rows])


class RowsSeen:
    """A step graph that notes how many rows each call runs."""

    def __init__(self, graph: Any) -> None:
        self.graph, self.rows = graph, list[int]()
        self.input_names, self.output_names = graph.input_names, graph.output_names
        self.device_resident, self.execution_provider = graph.device_resident, graph.execution_provider

    def run(self, inputs: Any, keep_on_device: Any = ()) -> Any:
        self.rows.append(len(inputs["tokens"]))
        return self.graph.run(inputs, keep_on_device)


def take_rows(order: np.ndarray, tensors: Any) -> dict[str, Any]:
    return {name: value[order] for name, value in tensors.items()}


@pytest.mark.parametrize("inside", [True, False], ids=["cache_order", "reorder"])
def test_greedy_drops_finished_rows_and_writes_what_each_row_writes_alone(inside: bool) -> None:
    """A row that has written the end leaves the step (its cache rows dropped by `cache_order`,
    or by the loop's `reorder` with its shared inputs by `select_shared`); every row writes the
    tokens, with the log-probabilities, it writes in a loop of its own."""
    torch.manual_seed(0)
    signature = toy_signature(2)
    inputs = (*signature.inputs[:4], "cache_order", *signature.inputs[4:]) if inside else signature.inputs
    module = ToyStepReordering(layers=2) if inside else ToyStep(layers=2)
    graph = RowsSeen(EagerGraph(module.eval(), inputs, signature.outputs))
    rng = np.random.default_rng(0)
    per_row = {"memory": rng.standard_normal((3, 7, DIM)).astype(np.float32), "memory_mask": np.ones((3, 7), dtype=np.float32)}
    limits = np.array([2, 5, 3])
    cache = KeyValueCache(2, HEADS, DIM // HEADS)

    def loop(rows: np.ndarray) -> Loop:
        firsts = np.arange(3, dtype=np.int64)[rows] + 3  # a different first token per row
        chosen = take_rows(rows, per_row)
        offsets, constraint = rows.astype(np.int64), EndAfter(limits[rows])
        if inside:
            return Loop(graph, {}, chosen, cache, firsts, END, offsets=offsets, constraint=constraint)
        return Loop(
            graph, chosen, {}, cache, firsts, END, offsets, constraint=constraint, reorder=take_rows, select_shared=take_rows
        )

    together = greedy(loop(np.arange(3)), max_steps=9)
    assert graph.rows == [3, 3, 2, 1, 1]
    assert together.finished.all() and together.tokens.shape == (3, 5)
    assert [int(np.argmax(row == END)) + 1 for row in together.tokens] == limits.tolist()
    for r in range(3):
        alone = greedy(loop(np.array([r])), max_steps=9)
        length = limits[r]
        np.testing.assert_array_equal(together.tokens[r, :length], alone.tokens[0, :length])
        np.testing.assert_allclose(together.log_probs[r, :length], alone.log_probs[0, :length], atol=1e-5)
        assert np.all(together.tokens[r, length:] == END) and np.all(together.log_probs[r, length:] == 0)


def rows_seen_and_three_rows() -> tuple[RowsSeen, dict[str, np.ndarray]]:
    """A toy step graph that takes `cache_order` (noting the rows of each call) and three rows' inputs."""
    torch.manual_seed(0)
    signature = toy_signature(2)
    inputs = (*signature.inputs[:4], "cache_order", *signature.inputs[4:])
    graph = RowsSeen(EagerGraph(ToyStepReordering(layers=2).eval(), inputs, signature.outputs))
    rng = np.random.default_rng(0)
    per_row = {"memory": rng.standard_normal((3, 7, DIM)).astype(np.float32), "memory_mask": np.ones((3, 7), dtype=np.float32)}
    return graph, per_row


def test_greedy_keeps_every_row_where_the_constraint_is_not_per_row() -> None:
    graph, per_row = rows_seen_and_three_rows()
    limits = np.array([2, 5, 3])
    not_per_row = EndAfter(limits).__call__  # the same rule, without `select`
    cache = KeyValueCache(2, HEADS, DIM // HEADS)
    greedy(Loop(graph, {}, per_row, cache, np.ones(3, dtype=np.int64), END, constraint=not_per_row), max_steps=9)
    assert graph.rows == [3] * 5


def test_beam_search_drops_complete_rows_and_finds_what_each_row_finds_alone() -> None:
    """A row whose beams have all finished leaves the step (its slots' cache dropped by
    `cache_order`); each row's hypotheses are those it finds in a search of its own."""
    graph, per_row = rows_seen_and_three_rows()
    limits, beams = np.array([2, 5, 3]), 3
    cache = KeyValueCache(2, HEADS, DIM // HEADS)

    def search(rows: np.ndarray) -> list[list[Hypothesis]]:
        constraint = EndAfter(np.repeat(limits[rows], beams))
        loop = Loop(graph, {}, take_rows(rows, per_row), cache, rows.astype(np.int64) + 3, END, constraint=constraint)
        return beam_search(loop, max_steps=9, beams=beams, keep=np.full(len(rows), beams))

    together = search(np.arange(3))
    assert graph.rows == [9, 9, 6, 3, 3]
    assert [{len(h.tokens) for h in row} for row in together] == [{2}, {5}, {3}]
    for r in range(3):
        assert same_hypotheses([together[r]], search(np.array([r])))
