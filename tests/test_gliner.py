"""The label-matching architecture's pieces without a trained model: label lists cut into passes
and joined back, training targets, decoding (flat, nested, threshold), and the training examples'
label lists (dropped, renamed, negatives of the other domain only)."""

import dataclasses
import random
from pathlib import Path

import numpy as np
import pytest

from nerserve.ner.archs.gliner import SPEC
from nerserve.ner.archs.gliner.config import GlinerConfig, GlinerOptions
from nerserve.ner.archs.gliner.decode import decode_batch
from nerserve.ner.archs.gliner.loss import pair_losses, pair_mask, targets_of
from nerserve.ner.archs.gliner.program import GlinerProgram, Pass, enumerate_spans, names_something, span_array
from nerserve.ner.backbone import resolve_backbone
from nerserve.ner.data import Sentence
from nerserve.ner.loading import build_network, eager_program
from nerserve.ner.lora import LoraSettings
from nerserve.ner.text.chars import char_rows
from nerserve.ner.training.gliner_trainer import Source, Widening, ask, domain_negatives, example_of
from nerserve.ner.training.label_synonyms import SYNONYMS
from nerserve.ner.types import Entity, EntitySet

SENTENCES = [["Peter", "Blackburn", "lives", "in", "Paris", "."], ["EU", "rejects", "German", "call"]]
NAMES = ("person", "location", "organization", "miscellaneous", "city")


@pytest.fixture(scope="module")
def program(tiny_backbone: Path) -> GlinerProgram:
    config = GlinerConfig(labels=NAMES, max_width=3, labels_per_pass=2, encoder={"lstm_hidden": 8}, hidden=8)
    backbone = resolve_backbone(str(tiny_backbone))
    network = build_network(SPEC, config, backbone, LoraSettings(rank=2, alpha=4)).eval()
    return eager_program(SPEC, network, backbone, "cpu")  # type: ignore[no-any-return]


def test_a_long_label_list_runs_in_passes_whose_scores_are_each_passes_own(program: GlinerProgram) -> None:
    batch = program.prepare(SENTENCES)
    assert [len(p.labels) for p in program.passes(0, NAMES, batch.sentences[0].subwords)] == [2, 2, 1]
    scores = program.run(batch, GlinerOptions(labels=NAMES))["scores"]
    assert scores.shape == (2, batch.spans.shape[1], len(NAMES))
    for first in (0, 2, 4):
        names = NAMES[first : first + 2]
        alone = program.graphs["encoder"].run(program.feeds(batch, [Pass(b, 0, names) for b in range(2)]))["scores"]
        np.testing.assert_allclose(scores[:, :, first : first + len(names)], alone[:, :, : len(names)], atol=1e-6)


def test_a_sentence_scores_the_same_alone_and_packed_with_others(program: GlinerProgram) -> None:
    options = GlinerOptions(labels=NAMES[:2])
    long = ["word"] * 90
    batch = program.prepare([long, ["short", "one"], *SENTENCES])
    passes = [Pass(b, 0, options.labels) for b in range(len(batch.lengths))]
    assert len(program.pass_groups(batch, passes)) == 2  # the long one alone, the short ones together
    together = program.run(batch, options)["scores"]
    for b, words in zip([0, 2, 3], [long, *SENTENCES], strict=True):
        single = program.prepare([words])
        alone = program.run(single, options)["scores"][0]
        scored = single.span_mask[0]
        np.testing.assert_allclose(together[b, : len(scored)][scored], alone[scored], atol=1e-5)


def test_a_batch_with_no_span_to_score_finds_nothing(program: GlinerProgram) -> None:
    batch = program.prepare([["@", "--"], ["!"]])
    options = GlinerOptions(labels=("person",), threshold=0.0)
    assert program.feeds(batch, [Pass(0, 0, ("person",)), Pass(1, 0, ("person",))])["spans"].shape == (0, 3)
    assert program.decode(batch, program.run(batch, options), options) == [EntitySet(), EntitySet()]


def test_a_sentence_that_leaves_little_room_gets_more_passes(program: GlinerProgram) -> None:
    room = program.subwords.max_subwords - program.subwords.special_count - 1
    assert len(program.passes(0, NAMES, room - 2)) == 5  # each name (marker + pieces) fills the rest alone


def test_requests_with_different_label_lists_share_a_batch(program: GlinerProgram) -> None:
    batch = program.prepare(SENTENCES)
    options = [GlinerOptions(labels=("person",), threshold=0.0), GlinerOptions(labels=NAMES, threshold=0.0)]
    found = program.decode(batch, program.run(batch, options), options)
    assert {e.type for e in found[0]} == {"person"}
    assert {e.type for e in found[1]} <= set(NAMES)
    assert all(e.end <= len(SENTENCES[b]) for b, entities in enumerate(found) for e in entities)


def test_spans_cover_every_width_up_to_the_bound() -> None:
    assert enumerate_spans(3, 2) == [(0, 1), (0, 2), (1, 2), (1, 3), (2, 3)]


def test_a_span_of_symbols_alone_is_never_a_candidate(program: GlinerProgram) -> None:
    words = ["@", "colgo", "--", "!", "hi"]
    spans = enumerate_spans(len(words), 2)
    kept = names_something([char_rows(words).shapes], np.array([spans]))[0].tolist()
    assert [s for s, k in zip(spans, kept, strict=True) if not k] == [(0, 1), (2, 3), (2, 4), (3, 4)]
    batch = program.prepare([words])
    masked = {tuple(s) for s, m in zip(batch.spans[0].tolist(), batch.span_mask[0].tolist(), strict=True) if not m}
    assert {(0, 1), (2, 3), (3, 4)} <= masked and (1, 2) not in masked and (0, 2) not in masked
    options = GlinerOptions(labels=("person",), threshold=0.0)  # every candidate above it
    found = program.decode(batch, program.run(batch, options), options)[0]
    assert found and all(any(ch.isalnum() for w in words[e.start : e.end] for ch in w) for e in found)


def test_a_batch_of_spans_names_something_where_a_word_has_a_letter_or_a_digit() -> None:
    """names_something reads the words' shapes for a whole batch: the same as asking each span's
    words for a letter or a digit, for words of symbols, digits, other scripts and numerals."""
    pool = ["@", "--", "!", "", "hi", "42", "½", "中国", "🙂", "x-1", "…", "Ⅻ", "'s"]
    generator = random.Random(5)
    sentences = [[generator.choice(pool) for _ in range(generator.randint(1, 9))] for _ in range(60)]
    width = max(len(span_array(len(words), 3)) for words in sentences)
    spans = np.zeros((len(sentences), width, 2), dtype=np.int64)
    spans[..., 1] = 1
    for b, words in enumerate(sentences):
        spans[b, : len(span_array(len(words), 3))] = span_array(len(words), 3)
    found = names_something([char_rows(words).shapes for words in sentences], spans)
    for b, words in enumerate(sentences):
        for (start, end), named in zip(span_array(len(words), 3).tolist(), found[b], strict=False):
            assert named == any(ch.isalnum() for word in words[start:end] for ch in word)


def test_targets_mark_the_asked_names_only() -> None:
    spans = np.array([[[0, 1], [0, 2], [1, 2]]])
    gold = [EntitySet([Entity("person", ((0, 2),)), Entity("location", ((1, 2),))])]
    targets = targets_of(spans, gold, [("person", "city")])
    assert targets[0].tolist() == [[0, 0], [1, 0], [0, 0]]
    mask = pair_mask(np.array([[True, True, False]]), [("person",)])
    assert mask.shape == (1, 3, 1) and mask[0, :, 0].tolist() == [1, 1, 0]


def decode_sentence(
    scores: np.ndarray, spans: np.ndarray, mask: np.ndarray, labels: tuple[str, ...], options: GlinerOptions
) -> EntitySet:
    return decode_batch(scores[None], spans[None], mask[None], [labels], [options])[0]


def test_focal_loss_quiets_the_pairs_already_right_and_alpha_weighs_positives() -> None:
    import torch
    import torch.nn.functional as F

    logits = torch.tensor([-6.0, -0.5, 0.5, 6.0])
    targets = torch.tensor([0.0, 0.0, 1.0, 1.0])
    plain = F.binary_cross_entropy_with_logits(logits, targets, reduction="none")
    assert torch.allclose(pair_losses(logits, targets), plain)
    focal = pair_losses(logits, targets, gamma=2.0)
    assert torch.all(focal < plain)
    # an easy pair (right at p = 0.998) loses almost all its weight; a doubtful one (p = 0.62) keeps a seventh
    assert focal[0] / plain[0] < 1e-4 and focal[1] / plain[1] > 0.1
    weighted = pair_losses(logits, targets, alpha=0.75)
    assert torch.allclose(weighted, plain * torch.tensor([0.25, 0.25, 0.75, 0.75]))


def test_decoding_flat_nested_and_threshold() -> None:
    spans = np.array([[0, 1], [0, 2], [1, 2], [2, 3]])
    scores = np.array([[0.9, 0.1], [0.8, 0.7], [0.2, 0.6], [0.1, 0.4]], dtype=np.float32)
    mask = np.array([True, True, True, False])
    labels = ("person", "organization")
    flat = decode_sentence(scores, spans, mask, labels, GlinerOptions(threshold=0.5))
    assert flat.keys() == {("person", ((0, 1),)), ("organization", ((1, 2),))}
    nested = decode_sentence(scores, spans, mask, labels, GlinerOptions(threshold=0.5, nested=True))
    # one label a span (the best), nesting kept; the masked span never appears
    assert nested.keys() == {("person", ((0, 1),)), ("person", ((0, 2),)), ("organization", ((1, 2),))}
    assert not decode_sentence(scores, spans, mask, labels, GlinerOptions(threshold=0.95))


def test_batch_decoding_is_the_rule_written_plainly() -> None:
    """Random batches (ties, masked spans, label lists of different lengths, per-sentence options):
    decode_batch gives what every pair above the threshold, accepted best first as Entities, gives."""
    from nerserve.ner.decoding.overlap import accept_best_first

    rng = np.random.default_rng(5)
    names = ("a", "b", "c", "d")
    for _ in range(40):
        batch, width = int(rng.integers(1, 5)), int(rng.integers(1, 10))
        starts = rng.integers(0, 6, size=(batch, width))
        spans = np.stack([starts, starts + rng.integers(1, 4, size=(batch, width))], axis=-1)
        scores = rng.choice([0.1, 0.4, 0.7, 0.7, 0.9], size=(batch, width, len(names))).astype(np.float32)
        mask = rng.random((batch, width)) > 0.2
        labels = [names[: int(rng.integers(1, len(names) + 1))] for _ in range(batch)]
        options = [GlinerOptions(threshold=float(rng.choice([0.3, 0.6])), nested=bool(rng.integers(2))) for _ in range(batch)]
        found = decode_batch(scores, spans, mask, labels, options)
        for b in range(batch):
            pairs = [
                Entity(labels[b][c], ((int(spans[b, r, 0]), int(spans[b, r, 1])),), float(scores[b, r, c]))
                for r in range(width)
                for c in range(len(labels[b]))
                if mask[b, r] and scores[b, r, c] > np.float32(options[b].threshold)
            ]
            expected = accept_best_first(pairs, "nested" if options[b].nested else "flat", one_type_per_span=True)
            assert sorted((e.key(), e.score) for e in found[b]) == sorted((e.key(), e.score) for e in expected)


def test_request_labels_are_required_and_bounded_by_the_options() -> None:
    with pytest.raises(ValueError, match="labels"):
        SPEC.request_options(GlinerOptions(), {}, None)
    options = SPEC.request_options(GlinerOptions(), {"threshold": 0.3, "nested": True}, ["drug"])
    assert options == GlinerOptions(threshold=0.3, nested=True, labels=("drug",))
    with pytest.raises(ValueError, match=r"options\.threshold"):
        SPEC.request_options(GlinerOptions(), {"threshold": 2.0}, ["drug"])


def test_training_examples_read_names_not_sets() -> None:
    sources = [
        Source("conll03", [], ("location", "miscellaneous", "organization", "person")),
        Source("ontonotes", [], ("date", "person")),
        Source("bc5cdr", [], ("chemical", "disease")),
    ]
    negatives = domain_negatives(sources)
    assert negatives["conll03"] == ["chemical", "disease"]  # never "date": an unannotated type of CoNLL
    assert negatives["bc5cdr"] == ["date", "location", "miscellaneous", "organization", "person"]
    sentence = Sentence(("Aspirin", "eased", "the", "pain"), EntitySet([Entity("chemical", ((0, 1),))]))
    rng = random.Random(3)
    seen_names: set[str] = set()
    for _ in range(200):
        example, asked = ask(sentence, sources[2], negatives["bc5cdr"], rng)
        assert len(set(asked)) == len(asked) and all(e.type in asked for e in example.entities)
        seen_names.update(asked)
        if not any(name in asked for name in ("chemical", *SYNONYMS["chemical"])):
            assert not example.entities  # a name dropped: its entity is not asked for
    assert seen_names & set(SYNONYMS["chemical"]) and "person" in seen_names


def test_some_general_examples_come_lowercased_never_biomedical_ones() -> None:
    news = Source("conll03", [], ("person",))
    medical = Source("genia", [], ("protein",))
    sentence = Sentence(("Peter", "met", "IL-2"), EntitySet([Entity("person", ((0, 1),))]))
    rng, widening = random.Random(5), Widening(renamed_share=0.0, lowercase_share=0.5)
    general = [example_of(sentence, news, ["protein"], rng, widening)[0] for _ in range(200)]
    assert {s.tokens for s in general} == {sentence.tokens, ("peter", "met", "il-2")}
    assert all(s.entities == sentence.entities for s in general)  # the entities stay where they were
    assert all(example_of(sentence, medical, [], rng, widening)[0].tokens == sentence.tokens for _ in range(50))


def test_every_training_name_has_other_names() -> None:
    # other names, not the same one in other case: the backbone is uncased
    assert all(len(names) == len(set(names)) and key.lower() not in names for key, names in SYNONYMS.items())
    # the sets the open-label bar is measured on are never taught their names under another key
    unseen = {"area", "point of interest", "river", "road", "material", "manufacturing process", "process parameter"}
    assert not unseen & {name for names in SYNONYMS.values() for name in names}
    assert dataclasses.asdict(GlinerOptions())["overlap"] == "nested"
