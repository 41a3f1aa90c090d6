"""The span architecture's pieces on a tiny random backbone: shapes, exact pooling, decoding rules,
and batch independence (a sentence's outputs do not depend on what it is batched with)."""

from pathlib import Path

import numpy as np
import pytest
import torch

from nerserve.ner.archs.span import SPEC
from nerserve.ner.archs.span.config import DecodeOptions, SpanConfig
from nerserve.ner.archs.span.decode import decode_batch, soft_nms
from nerserve.ner.archs.span.graphs import (
    SpanProposalGraph,
    level_of_length,
    levels_for,
    range_max,
    range_max_table,
    table_level,
)
from nerserve.ner.archs.span.program import batch_seeds
from nerserve.ner.backbone import resolve_backbone
from nerserve.ner.decoding.overlap import accept_best_first, best_per
from nerserve.ner.loading import build_network, eager_program
from nerserve.ner.lora import LoraSettings, load_weights, save_weights
from nerserve.ner.types import Entity, EntitySet

SENTENCES = [
    ["EU", "rejects", "German", "call", "to", "boycott", "British", "lamb", "."],
    ["Peter", "Blackburn"],
    ["BRUSSELS", "1996-08-22"],
    ["The", "European", "Commission", "said", "on", "Thursday", "it", "disagreed", "with", "German", "advice", "."],
]


@pytest.fixture(scope="module")
def tiny_network(tiny_backbone: Path):
    torch.manual_seed(0)
    config = SpanConfig(labels=("LOC", "MISC", "ORG", "PER"), max_width=4, encoder={"lstm_hidden": 16, "char_filters": 8})
    backbone = resolve_backbone(str(tiny_backbone))
    network = build_network(SPEC, config, backbone, LoraSettings(rank=2, alpha=4)).eval()
    return network, backbone


def test_range_max_is_exact() -> None:
    torch.manual_seed(1)
    states = torch.randn(2, 11, 5)
    mask = torch.ones(2, 11)
    mask[1, 7:] = 0
    table = range_max_table(states, mask, levels=4)
    spans = [(s, e) for s in range(11) for e in range(s + 1, 12)]
    starts = torch.tensor([s for s, _ in spans] * 2)
    ends = torch.tensor([e for _, e in spans] * 2)
    sentence = torch.tensor([0] * len(spans) + [1] * len(spans))
    pooled = range_max(table, 11, sentence, starts, ends, 4, level_of_length(4)).reshape(2, len(spans), 5)
    for k, (s, e) in enumerate(spans):
        assert torch.allclose(pooled[0, k], states[0, s:e].max(dim=0).values)
        if e <= 7:
            assert torch.allclose(pooled[1, k], states[1, s:e].max(dim=0).values)


def test_table_level_is_the_floor_of_log2_capped_at_the_top_level() -> None:
    lengths = torch.arange(1, 600)
    for levels in range(1, 10):
        expected = torch.floor(torch.log2(lengths.double())).long().clamp(max=levels - 1)
        assert torch.equal(table_level(lengths, levels, level_of_length(levels)), expected), levels
        # a scorer of fewer levels reads the fused graph's table of nine (SpanProposalGraph.first_layers)
        assert torch.equal(table_level(lengths, levels, level_of_length(9)), expected), levels
    assert table_level(torch.zeros(0, dtype=torch.long), 9, level_of_length(9)).shape == (0,)


def test_adjust_moves_both_ways_and_stays_legal() -> None:
    seeds = torch.tensor([[[2, 4], [0, 1], [3, 4]]])
    offsets = torch.tensor([[[-1.2, 0.6], [-3.0, 9.0], [1.0, -1.0]]])
    spans = SpanProposalGraph.adjust(seeds, offsets, torch.tensor([5]))
    assert spans.tolist() == [[[1, 5], [0, 5], [3, 4]]]  # left shift, clipped, reverted when empty


def enumerate_seeds(n_words: int, max_width: int) -> list[tuple[int, int]]:
    """A sentence's seeds as the graphs take them: every span of 1 to max_width words, by width, then start."""
    return [(i, i + w) for w in range(1, max_width + 1) for i in range(n_words - w + 1)]


def test_seeds_enumerate_every_width() -> None:
    seeds = enumerate_seeds(3, 2)
    assert seeds == [(0, 1), (1, 2), (2, 3), (0, 2), (1, 3)]


@pytest.mark.parametrize("max_width", [1, 3, 8])
def test_a_batchs_seeds_are_each_sentences_own_then_masked_padding(max_width: int) -> None:
    """batch_seeds gathers from a table by length: each row holds its sentence's enumerate_seeds,
    then the padding span [0, 1) masked out, up to the longest sentence's count."""
    rng = np.random.default_rng(max_width)
    for lengths in ([1], [2, 1], [5, 3, 5], rng.integers(1, 70, size=33).tolist(), [256, 1, 130]):
        seeds, mask = batch_seeds(lengths, max_width)
        own = [enumerate_seeds(n, max_width) for n in lengths]
        assert seeds.shape == (len(lengths), max(map(len, own)), 2) and mask.shape == seeds.shape[:2]
        for row, listed in enumerate(own):
            assert seeds[row, : len(listed)].tolist() == [list(seed) for seed in listed]
            assert (seeds[row, len(listed) :] == [0, 1]).all()
            assert mask[row].tolist() == [1.0] * len(listed) + [0.0] * (seeds.shape[1] - len(listed))


def test_outputs_do_not_depend_on_batch(tiny_network) -> None:
    network, backbone = tiny_network
    program = eager_program(SPEC, network, backbone, "cpu")
    every_seed = DecodeOptions(filter_threshold=0.0)  # every seed a candidate: none flips at the threshold
    together = program.prepare(SENTENCES)
    outputs = program.run(together, every_seed)
    assert len(outputs["candidates"]) == int(together.seed_mask.sum())
    for b, sentence in enumerate(SENTENCES):
        alone = program.run(program.prepare([sentence]), every_seed)
        n, mine = len(sentence), outputs["candidates"][:, 0] == b
        np.testing.assert_allclose(alone["word_states"][0, :n], outputs["word_states"][b, :n], atol=1e-5)
        np.testing.assert_array_equal(alone["candidates"][:, 1], outputs["candidates"][mine, 1])
        np.testing.assert_allclose(alone["class_probs"], outputs["class_probs"][mine], atol=1e-5)
        np.testing.assert_array_equal(alone["spans"], outputs["spans"][mine])


def test_grouped_calls_give_the_whole_batchs_candidates(tiny_network) -> None:
    """On the CPU the span proposal runs on groups of similar seed counts; their candidates,
    joined, are the one call's: batch sentence numbers, sentence by sentence, seeds in order."""
    from nerserve.ner.archs.grouping import size_groups

    network, backbone = tiny_network
    program = eager_program(SPEC, network, backbone, "cpu")
    sentences = [
        ["Paris"],
        ["The", "European", "Commission", "said", "on", "Thursday", "it", "disagreed"],
        ["EU", "rejects"],
    ] * 2
    batch = program.prepare(sentences)
    assert len(size_groups(batch.seed_mask.sum(axis=1).tolist())) > 1
    encoded = program.graphs["encoder"].run(batch.encoder_inputs)
    every_seed = DecodeOptions(filter_threshold=0.0)
    grouped = program.propose(batch, encoded, every_seed)
    whole = program.graphs["span_proposal"].run(program.span_inputs(batch, encoded, every_seed))
    np.testing.assert_array_equal(grouped["candidates"], whole["candidates"])
    np.testing.assert_array_equal(grouped["spans"], whole["spans"])
    np.testing.assert_allclose(grouped["class_probs"], whole["class_probs"], atol=1e-5)


def _proposal_inputs(words: int, batch: int = 2) -> tuple[torch.Tensor, ...]:
    """Random word states and context, sentences of `words` words (the last one shorter), each
    sentence's seeds of up to 4 words (the last one's past its words masked, as a program's are),
    and a filter threshold every seed passes."""
    states, context = torch.randn(batch, words, 16), torch.randn(batch, 8)
    word_mask = torch.ones(batch, words)
    word_mask[-1, max(words // 2, 1) :] = 0
    seeds = torch.tensor([enumerate_seeds(words, 4)] * batch)
    seed_mask = (seeds[..., 1] <= word_mask.sum(dim=1, keepdim=True)).float()
    return states, context, word_mask, seeds, seed_mask, torch.zeros(batch)


def test_a_fused_proposal_graph_gives_the_trained_forms_outputs_and_a_traced_one_keeps_every_level() -> None:
    """fuse_for_eager: one product for the scorers' per-word layers, one for their per-sentence layers, one
    range-max table. Eagerly it builds only the levels its sentences can use; a trace is made on one
    example's length, so it must keep every level for the longer sentences it is run on later."""
    torch.manual_seed(3)
    graph = SpanProposalGraph(16, 8, n_classes=3, hidden=12, dropout=0.0, levels=6, max_width=4).eval()
    short, long = _proposal_inputs(5), _proposal_inputs(29)
    with torch.inference_mode():
        expected = [graph(*inputs) for inputs in (short, long)]
    graph.fuse_for_eager()
    assert levels_for(5, 6) == 3 and levels_for(29, 6) == 5 and levels_for(200, 6) == 6
    with torch.inference_mode():
        traced = torch.jit.trace(graph, short, check_trace=False)
        for inputs, (candidates, spans, probs) in zip((short, long), expected, strict=True):
            for got in (graph(*inputs), traced(*inputs)):
                torch.testing.assert_close(got[0], candidates)
                torch.testing.assert_close(got[1], spans)
                torch.testing.assert_close(got[2], probs, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("words", "stretch"), [(2, 0.0), (5, 0.0), (29, 0.0), (40, 30.0)])
def test_a_fused_proposal_graph_passes_adjusts_and_classifies_as_the_trained_form(words: int, stretch: float) -> None:
    """Fused, the regressor scores every real seed beside the filter and the passed seeds' offsets are
    picked after: at a threshold some seeds pass and some do not, the candidates, spans and
    probabilities are the trained form's. STRETCH moves every adjusted span's ends outwards, so that
    spans of 40 words read a table past the top level's width (32 words at six levels)."""
    torch.manual_seed(7)
    graph = SpanProposalGraph(16, 8, n_classes=3, hidden=12, dropout=0.0, levels=6, max_width=4).eval()
    with torch.no_grad():
        graph.regressor.out.bias += torch.tensor([-stretch, stretch])
    states, context, word_mask, seeds, seed_mask, _ = _proposal_inputs(words, batch=3)
    with torch.inference_mode():
        every_seed = torch.softmax(graph.filter(states, context, word_mask, seeds), dim=-1)[..., 1]
        thresholds = every_seed.median().repeat(3)
        expected = graph(states, context, word_mask, seeds, seed_mask, thresholds)
        graph.fuse_for_eager()
        got = graph(states, context, word_mask, seeds, seed_mask, thresholds)
    assert 0 < len(expected[0]) < int(seed_mask.sum())
    if stretch:
        assert int((expected[1][:, 1] - expected[1][:, 0]).max()) == words
    torch.testing.assert_close(got[0], expected[0])
    torch.testing.assert_close(got[1], expected[1])
    torch.testing.assert_close(got[2], expected[2], atol=1e-5, rtol=1e-5)


def test_the_filter_passes_the_real_seeds_it_scores_as_over_every_seed() -> None:
    """The graph's filter scores a sentence's own seeds only; the seeds it passes are those the
    trained form (every seed of [B, K], padding included) scores above each sentence's threshold,
    in the same order, whatever the padding holds."""
    torch.manual_seed(5)
    graph = SpanProposalGraph(16, 8, n_classes=3, hidden=12, dropout=0.0, levels=6, max_width=4).eval()
    states, context, word_mask, seeds, seed_mask, _ = _proposal_inputs(11, batch=3)
    own = torch.tensor(enumerate_seeds(5, 4))  # the last sentence's 5 words (_proposal_inputs)
    real = len(own)
    seeds[-1, :real], seeds[-1, real:] = own, torch.tensor([7, 9])  # then padding seeds, past its words
    seed_mask[-1, real:] = 0
    with torch.inference_mode():
        every_seed = torch.softmax(graph.filter(states, context, word_mask, seeds), dim=-1)[..., 1]
        thresholds = every_seed[seed_mask > 0].median().repeat(3)
        thresholds[1] = 0.0  # every seed of the second sentence passes
        scored: list[int] = []
        hook = graph.filter.out.register_forward_hook(lambda _, inputs, __: scored.append(inputs[0].shape[0]))
        candidates, spans, _ = graph(states, context, word_mask, seeds, seed_mask, thresholds)
        hook.remove()
    assert scored == [int(seed_mask.sum())]  # the real seeds, not [B, K]
    expected = torch.nonzero((seed_mask > 0) & (every_seed > thresholds.unsqueeze(1)))
    assert 0 < len(expected) < int(seed_mask.sum())
    torch.testing.assert_close(candidates, expected)
    assert int((candidates[:, 0] == 1).sum()) == int(seed_mask[1].sum())
    assert bool((spans[candidates[:, 0] == 2, 1] <= 5).all())


def test_weights_roundtrip_fp16(tiny_network, tmp_path: Path) -> None:
    network, backbone = tiny_network
    save_weights(network, tmp_path / "w.safetensors")
    fresh = build_network(SPEC, network.config, backbone, LoraSettings(rank=2, alpha=4))
    load_weights(fresh, tmp_path / "w.safetensors")
    for (name, a), (_, b) in zip(network.named_parameters(), fresh.named_parameters(), strict=True):
        if a.requires_grad:
            assert torch.allclose(a.half().float(), b), name


def _probs(rows: list[tuple[int, float]], classes: int = 3) -> np.ndarray:
    probs = np.zeros((len(rows), classes + 1), dtype=np.float32)
    for i, (c, p) in enumerate(rows):
        probs[i, c] = p
        probs[i, 0] = 1 - p
    return probs


def decode_sentence(
    filter_prob: np.ndarray,
    spans: np.ndarray,
    probs: np.ndarray,
    seed_mask: np.ndarray,
    labels: tuple[str, ...],
    options: DecodeOptions,
) -> EntitySet:
    return decode_batch(
        *graph_candidates(filter_prob[None], spans[None], probs[None], seed_mask[None], [options]), labels, [options]
    )[0]


def graph_candidates(
    filter_prob: np.ndarray, spans: np.ndarray, probs: np.ndarray, seed_mask: np.ndarray, options: list[DecodeOptions]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """What the span-proposal graph gives decoding from [B, K] filter probabilities, spans and class
    probabilities: the seeds its filter passes, sentence by sentence."""
    thresholds = np.array([o.filter_threshold for o in options], dtype=np.float32)[:, None]
    candidates = np.argwhere((seed_mask > 0) & (filter_prob > thresholds))
    sentence, k = candidates[:, 0], candidates[:, 1]
    return candidates, spans[sentence, k], probs[sentence, k]


def test_decode_flat_and_nested_rules() -> None:
    spans = np.array([[0, 3], [0, 1], [1, 4], [5, 6], [5, 6]])
    probs = _probs([(1, 0.9), (2, 0.8), (1, 0.7), (3, 0.6), (2, 0.95)])
    keep = np.ones(5, dtype=np.float32)
    labels = ("A", "B", "C")
    flat = decode_sentence(keep, spans, probs, keep, labels, DecodeOptions(threshold=0.5, nms_iou=1.0, overlap="flat"))
    assert {(e.type, e.fragments) for e in flat} == {("A", ((0, 3),)), ("B", ((5, 6),))}
    nested = decode_sentence(keep, spans, probs, keep, labels, DecodeOptions(threshold=0.5, nms_iou=1.0, overlap="nested"))
    # [0,3) ⊃ [0,1) is nesting (kept); [1,4) crosses [0,3) (dropped); duplicate [5,6) keeps its best type
    assert {(e.type, e.fragments) for e in nested} == {("A", ((0, 3),)), ("B", ((0, 1),)), ("B", ((5, 6),))}
    filtered = decode_sentence(np.zeros(5), spans, probs, keep, labels, DecodeOptions())
    assert not filtered


def test_soft_nms_decays_overlapping() -> None:
    kept, scores = soft_nms([(0, 4), (0, 3), (6, 7)], [0.9, 0.85, 0.5], decay=0.5, iou_threshold=0.6)
    # [0,3) has IoU 0.75 with [0,4): its score is decayed below the distant [6,7)
    assert kept == [0, 2, 1]
    assert scores == [0.9, 0.425, 0.5]


def test_soft_nms_is_the_papers_algorithm_on_random_candidates() -> None:
    """Against Algorithm 1 written plainly (take the best, decay each remaining proposal whose IoU
    with it is ≥ k, re-sort): the same entities, in the same order, with the same scores."""
    from dataclasses import replace

    def reference(items: list[Entity], decay: float, k: float) -> list[Entity]:
        def iou(a: Entity, b: Entity) -> float:
            inter = min(a.end, b.end) - max(a.start, b.start)
            return inter / ((a.end - a.start) + (b.end - b.start) - inter) if inter > 0 else 0.0

        pending, kept = sorted(items, key=lambda c: -c.score), []
        while pending:
            current = pending.pop(0)
            kept.append(current)
            pending = [replace(c, score=c.score * decay) if iou(c, current) >= k else c for c in pending]
            pending.sort(key=lambda c: -c.score)
        return kept

    rng = np.random.default_rng(7)
    for _ in range(300):
        items = []
        for _ in range(int(rng.integers(0, 9))):
            start = int(rng.integers(0, 12))
            score = float(rng.choice([0.5, 0.7, round(float(rng.random()), 3)]))  # ties included
            items.append(Entity(str(rng.choice(["A", "B"])), ((start, start + int(rng.integers(1, 5))),), score))
        decay, k = float(rng.choice([0.3, 0.5, 1.0])), float(rng.choice([0.0, 0.3, 0.6, 1.0]))
        kept, scores = soft_nms([e.fragments[0] for e in items], [e.score for e in items], decay, k)
        expected = reference(items, decay, k)
        assert [items[i].key() for i in kept] == [e.key() for e in expected]
        assert [scores[i] for i in kept] == [e.score for e in expected]


def test_batch_decoding_is_the_rule_written_plainly() -> None:
    """Random batches (ties, duplicate spans, spans crowded or apart, filtered and masked spans,
    per-sentence options):
    decode_batch gives, sentence by sentence, what the rule gives written with Entities — the best
    type of each span above δ, the best of each span, Soft-NMS, δ again, the overlap rule."""
    from dataclasses import replace

    def reference(filter_prob, spans, probs, seed_mask, labels, options: DecodeOptions) -> EntitySet:  # type: ignore[no-untyped-def]
        found = []
        for k in range(len(spans)):
            c = int(probs[k].argmax())
            score = probs[k, c]
            if (
                seed_mask[k] > 0
                and filter_prob[k] > np.float32(options.filter_threshold)
                and c > 0
                and score > np.float32(options.threshold)
            ):
                found.append(Entity(labels[c - 1], ((int(spans[k, 0]), int(spans[k, 1])),), float(score)))
        pending, kept = sorted(best_per(found, key=lambda e: e.fragments), key=lambda e: -e.score), []
        while pending:
            current = pending.pop(0)
            kept.append(current)
            for i, other in enumerate(pending):
                inter = min(current.end, other.end) - max(current.start, other.start)
                union = (current.end - current.start) + (other.end - other.start) - inter
                if (inter / union if inter > 0 else 0.0) >= options.nms_iou:
                    pending[i] = replace(other, score=other.score * options.nms_decay)
            pending.sort(key=lambda e: -e.score)
        return accept_best_first((e for e in kept if e.score > options.threshold), options.overlap)

    rng = np.random.default_rng(11)
    labels = ("A", "B", "C")
    for _ in range(200):
        batch, k = int(rng.integers(1, 6)), int(rng.integers(1, 14))
        starts = rng.integers(0, int(rng.choice([8, 40])), size=(batch, k))  # crowded, or mostly apart
        spans = np.stack([starts, starts + rng.integers(1, 4, size=(batch, k))], axis=-1)
        probs = rng.choice([0.1, 0.3, 0.6, 0.6, 0.9], size=(batch, k, 4)).astype(np.float32)  # ties included
        filter_prob = rng.random((batch, k)).astype(np.float32)
        seed_mask = (rng.random((batch, k)) > 0.2).astype(np.float32)
        options = [
            DecodeOptions(
                threshold=float(rng.choice([0.2, 0.5])),
                filter_threshold=float(rng.choice([0.0, 0.3])),
                nms_decay=float(rng.choice([0.5, 0.9])),
                nms_iou=float(rng.choice([0.0, 0.3, 0.6, 1.0])),  # k = 0 decays even spans apart
                overlap=str(rng.choice(["flat", "nested", "any"])),  # type: ignore[arg-type]
            )
            for _ in range(batch)
        ]
        found = decode_batch(*graph_candidates(filter_prob, spans, probs, seed_mask, options), labels, options)
        for b in range(batch):
            expected = reference(filter_prob[b], spans[b], probs[b], seed_mask[b], labels, options[b])
            assert sorted((e.key(), e.score) for e in found[b]) == sorted((e.key(), e.score) for e in expected)
