"""DiffusionNER's pieces: the float64 schedule and DDIM step times, gold spans ↔ noise ↔ word
boundaries, post-processing rules, Hungarian matching, and on a tiny random backbone: reproducible
noise, sentences independent of their batch (mixed K and steps included), and a training step."""

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from nerserve.ner.archs.diffusion import SPEC
from nerserve.ner.archs.diffusion.config import DiffusionConfig, DiffusionDecodeOptions
from nerserve.ner.archs.diffusion.decode import decode_batch
from nerserve.ner.archs.diffusion.graphs import DenoiserGraph
from nerserve.ner.archs.diffusion.loss import clean_spans, diffusion_loss, gold_spans, match
from nerserve.ner.archs.diffusion.schedule import Sampler, alphas_cumprod, spans_to_noise, step_pairs
from nerserve.ner.backbone import resolve_backbone
from nerserve.ner.decoding.overlap import accept_best_first
from nerserve.ner.loading import build_network, eager_program
from nerserve.ner.lora import LoraSettings
from nerserve.ner.types import Entity, EntitySet

LABELS = ("DNA", "protein")
SENTENCES = [
    ["IL-2", "gene", "expression", "requires", "NF-kappa", "B", "activation", "."],
    ["Cells", "."],
    ["The", "CD28", "surface", "receptor", "binds", "B7", "on", "human", "T", "cells", "in", "vitro", "."],
]


@pytest.mark.parametrize("schedule", ["cosine", "linear"])
def test_schedule_is_float64_and_decreasing(schedule: str) -> None:
    alphas = alphas_cumprod(schedule, 1000)
    assert alphas.dtype == np.float64 and alphas.shape == (1000,)
    assert np.all(np.diff(alphas) < 0) and 0.99 < alphas[0] < 1.0
    assert 0.0 < alphas[-1] < 1e-3  # tiny near T: exactly why it stays out of the fp16/fp32 graphs


def test_ddim_step_times() -> None:
    assert step_pairs(1000, 5) == [(999, 799), (799, 599), (599, 399), (399, 199), (199, -1)]
    assert step_pairs(1000, 1) == [(999, -1)]
    assert len(step_pairs(1000, 10)) == 10


def test_gold_spans_survive_noise_space_and_back() -> None:
    """Every span of every sentence length maps to noise and back to the same words in the graph."""
    graph = DenoiserGraph(8, DiffusionConfig(labels=LABELS, span_heads=2, span_ffn=8, pointer_dim=4))
    for length in (1, 2, 5, 17, 60):
        left, right = np.triu_indices(length)
        x0 = spans_to_noise(left.astype(float), right.astype(float), np.full(len(left), length), 1.0)
        mask = torch.zeros(1, length + 3)
        mask[0, :length] = 1.0
        got_left, got_right = graph.span_words(torch.from_numpy(x0[None].astype(np.float32)), mask)
        assert got_left[0].tolist() == left.tolist() and got_right[0].tolist() == right.tolist()


def test_ddim_with_exact_predictions_reaches_the_prediction() -> None:
    """With exact x̂0 and σ = 0 (eta 0), DDIM steps move x_t to x̂0 as the noise level falls."""
    config = DiffusionConfig(labels=LABELS, eta=0.0)
    sampler = Sampler(config)
    x0 = np.array([[[-0.5, 0.25]]])
    x = np.random.default_rng(0).standard_normal(x0.shape)
    for t, t_next in step_pairs(1000, 5)[:-1]:
        x = sampler.step(x, x0, t, t_next, np.zeros_like(x))
    assert np.abs(x - x0).max() < 0.3  # at t = 199 most of the noise is gone


def options(**changes: object) -> DiffusionDecodeOptions:
    return DiffusionDecodeOptions(**{"threshold": 0.5, **changes})  # type: ignore[arg-type]


def proposals(rows: list[tuple[int, int, int, float]], words: int = 6, pad: int = 2) -> tuple[np.ndarray, ...]:
    """(left, right inclusive, class, probability) per proposal → class/left/right probabilities."""
    classes = np.full((len(rows), len(LABELS) + 1), 0.0, dtype=np.float32)
    left = np.full((len(rows), words + pad), 0.01, dtype=np.float32)
    right = left.copy()
    left[:, words:] = right[:, words:] = 0.0  # padding words
    for k, (lo, hi, c, p) in enumerate(rows):
        classes[k, c] = p
        classes[k, 0 if c else 1] = 1 - p
        left[k, lo] = right[k, hi] = p
    return classes, left, right


def decode_sentence(
    classes: np.ndarray,
    left: np.ndarray,
    right: np.ndarray,
    length: int,
    labels: tuple[str, ...],
    options: DiffusionDecodeOptions,
) -> EntitySet:
    owner = np.zeros(len(classes), dtype=np.int64)
    return decode_batch(classes, left, right, owner, [length], labels, [options])[0]


def test_decode_thresholds_duplicates_and_overlap_rules() -> None:
    rows = [
        (0, 1, 1, 0.9),  # DNA [0, 2)
        (0, 1, 2, 0.8),  # same boundaries, other type: the less probable one goes (paper)
        (1, 1, 2, 0.7),  # nested inside the first: kept only in nested mode
        (1, 3, 2, 0.95),  # crosses the first
        (4, 3, 1, 0.99),  # left > right: never an entity
        (5, 5, 0, 0.99),  # class 0: no entity
        (4, 4, 1, 0.4),  # under the threshold
    ]
    classes, left, right = proposals(rows)
    flat = decode_sentence(classes, left, right, 6, LABELS, options(overlap="flat"))
    assert flat.keys() == {("protein", ((1, 4),))}  # best first: the crossing one wins
    nested_rows = [r for r in rows if r[:2] != (1, 3)]
    classes, left, right = proposals(nested_rows)
    nested = decode_sentence(classes, left, right, 6, LABELS, options(overlap="nested"))
    assert nested.keys() == {("DNA", ((0, 2),)), ("protein", ((1, 2),))}
    assert all(0.0 < e.score <= 1.0 for e in nested)


def test_batch_decoding_is_the_rule_written_plainly() -> None:
    """Random batches (proposals of sentences interleaved, padding words past a sentence's end, ties,
    spans crowded or apart, per-sentence options): decode_batch gives, sentence by sentence, what the rule gives on that
    sentence's proposals alone, written with Entities."""

    def reference(class_probs, left_probs, right_probs, length, options_):  # type: ignore[no-untyped-def]
        left, right = left_probs[:, :length].argmax(axis=-1), right_probs[:, :length].argmax(axis=-1)
        found = []
        for k in range(len(class_probs)):
            c = int(class_probs[k].argmax())
            score = (class_probs[k].max() + left_probs[k, left[k]] + right_probs[k, right[k]]) / 3.0
            if c > 0 and left[k] <= right[k] and score > np.float32(options_.threshold):
                found.append(Entity(LABELS[c - 1], ((int(left[k]), int(right[k]) + 1),), float(score)))
        return accept_best_first(found, options_.overlap, one_type_per_span=True)

    rng = np.random.default_rng(3)
    for _ in range(200):
        batch, per, words = int(rng.integers(1, 5)), int(rng.integers(1, 8)), int(rng.choice([7, 40]))  # crowded or apart
        lengths = rng.integers(1, words + 1, size=batch).tolist()
        owner = rng.permutation(np.repeat(np.arange(batch), per))
        pick = [0.05, 0.3, 0.3, 0.8]  # ties included
        class_probs = rng.choice(pick, size=(len(owner), len(LABELS) + 1)).astype(np.float32)
        left_probs = rng.choice(pick, size=(len(owner), words)).astype(np.float32)
        right_probs = rng.choice(pick, size=(len(owner), words)).astype(np.float32)
        chosen = [
            options(threshold=float(rng.choice([0.2, 0.4])), overlap=str(rng.choice(["flat", "nested"]))) for _ in range(batch)
        ]
        found = decode_batch(class_probs, left_probs, right_probs, owner, lengths, LABELS, chosen)
        for b in range(batch):
            mine = owner == b
            expected = reference(class_probs[mine], left_probs[mine], right_probs[mine], lengths[b], chosen[b])
            assert sorted((e.key(), e.score) for e in found[b]) == sorted((e.key(), e.score) for e in expected)


def test_hungarian_matches_each_gold_span_once() -> None:
    classes, left, right = proposals([(2, 3, 1, 0.6), (0, 0, 2, 0.9), (2, 3, 1, 0.95)])
    gold = [(0, 0, 2), (2, 3, 1)]
    rows, cols = match(classes, left, right, gold, 1.0)
    assert sorted(zip(rows.tolist(), cols.tolist(), strict=True)) == [(1, 0), (2, 1)]  # the better duplicate wins


def test_one_to_many_matching_spreads_every_gold_entity() -> None:
    classes, left, right = proposals([(2, 3, 1, 0.6), (0, 0, 2, 0.9), (2, 3, 1, 0.95), (0, 0, 2, 0.5), (5, 5, 1, 0.4)])
    gold = [(0, 0, 2), (2, 3, 1)]
    rows, cols = match(classes, left, right, gold, 1.0, copies=4)
    assignment = dict(zip(rows.tolist(), cols.tolist(), strict=True))
    assert assignment == {0: 1, 1: 0, 2: 1, 3: 0}  # each gold twice, the odd proposal out unmatched
    rows, cols = match(classes, left, right, gold, 1.0, copies=60)  # capped at the proposal count
    assert len(rows) == 5 and sorted(cols.tolist()).count(0) >= 2


def test_clean_spans_repeat_gold_and_fill_empty_sentences() -> None:
    config = DiffusionConfig(labels=LABELS, train_proposals=5)
    gold = gold_spans(EntitySet({Entity("protein", ((4, 6),)), Entity("DNA", ((0, 2),))}), LABELS)
    assert gold == [(0, 1, 1), (4, 5, 2)]
    x0 = clean_spans([gold, []], np.array([8, 3]), config, np.random.default_rng(0))
    expected = spans_to_noise(np.array([0.0, 4.0]), np.array([1.0, 5.0]), np.array([8, 8]), 1.0)
    np.testing.assert_allclose(x0[0], expected[[0, 1, 0, 1, 0]])
    assert np.all(np.abs(x0[1]) <= 1.0)


@pytest.fixture(scope="module")
def tiny_program(tiny_backbone: Path):
    torch.manual_seed(0)
    config = DiffusionConfig(
        labels=LABELS,
        encoder={"lstm_hidden": 16, "char_filters": 8},
        span_heads=2,
        span_ffn=64,
        pointer_dim=16,
        train_proposals=6,
        decode=DiffusionDecodeOptions(proposals=9, steps=3, threshold=0.0, overlap="nested"),
    )
    backbone = resolve_backbone(str(tiny_backbone))
    network = build_network(SPEC, config, backbone, LoraSettings(rank=2, alpha=4)).eval()
    return eager_program(SPEC, network, backbone, "cpu")


def test_same_seed_same_entities_other_seed_other_noise(tiny_program) -> None:
    first = tiny_program.predict(SENTENCES)
    assert tiny_program.predict(SENTENCES) == first
    batch = tiny_program.prepare(SENTENCES)
    a = tiny_program.run(batch)["left_probs"]
    b = tiny_program.run(batch, replace(tiny_program.config.decode, seed=7))["left_probs"]
    assert not np.allclose(a, b)


def test_sentences_do_not_depend_on_batch_or_neighbours_options(tiny_program) -> None:
    defaults = tiny_program.config.decode
    mixed = [defaults, replace(defaults, proposals=4, steps=1), replace(defaults, seed=3)]
    together = tiny_program.prepare(SENTENCES)
    outputs = tiny_program.run(together, mixed)
    decoded = tiny_program.decode(together, outputs, mixed)
    assert sum(len(d) for d in decoded) > 0  # threshold 0 on random weights: entities to compare
    for b, sentence in enumerate(SENTENCES):
        alone_batch = tiny_program.prepare([sentence])
        alone = tiny_program.run(alone_batch, mixed[b])
        mine = outputs["proposal_sentence"] == b
        assert mine.sum() == mixed[b].proposals
        words = len(sentence)
        for name in ("left_probs", "right_probs"):
            np.testing.assert_allclose(alone[name][:, :words], outputs[name][mine][:, :words], atol=1e-5)
        np.testing.assert_allclose(alone["class_probs"], outputs["class_probs"][mine], atol=1e-5)
        assert tiny_program.decode(alone_batch, alone, mixed[b])[0].keys() == decoded[b].keys()


def test_loss_trains_the_denoiser_and_the_encoder(tiny_program) -> None:
    encoder = tiny_program.graphs["encoder"].module
    denoiser = tiny_program.graphs["denoiser"].module

    class Parts(torch.nn.Module):  # the attributes diffusion_loss reads from a DiffusionNetwork
        def __init__(self) -> None:
            super().__init__()
            self.encoder, self.denoiser, self.config = encoder, denoiser, tiny_program.config

    batch = tiny_program.prepare(SENTENCES)
    inputs = {k: torch.from_numpy(v) for k, v in batch.encoder_inputs.items()}
    gold = [
        EntitySet({Entity("DNA", ((0, 2),)), Entity("protein", ((4, 6),))}),
        EntitySet(),
        EntitySet({Entity("protein", ((1, 4),))}),
    ]
    loss, parts = diffusion_loss(Parts(), inputs, gold, Sampler(tiny_program.config), np.random.default_rng(0))  # type: ignore[arg-type]
    assert torch.isfinite(loss) and set(parts) == {"type", "boundary"}
    loss.backward()
    assert denoiser.left.out.weight.grad is not None and encoder.lstm.forward_lstm.weight_ih_l0.grad is not None
