"""setgen and bartner's shared pointer decoding: targets, the grammar that keeps sequences
parseable, parsing into (discontinuous) fragments, beam search keeping several entities per head,
and on tiny random backbones: sentences independent of their batch, and a training step."""

import random
from pathlib import Path

import numpy as np
import pytest
import torch

from nerserve.ner.archs import bartner, setgen
from nerserve.ner.archs.bartner.config import BartnerConfig, BartnerOptions
from nerserve.ner.archs.pointer.decoding import Grammar, parse_groups
from nerserve.ner.archs.pointer.targets import IGNORE, sequence_of, teacher
from nerserve.ner.archs.pointer.vocabulary import END, FRAGMENT, NULL, START, Vocabulary
from nerserve.ner.archs.setgen.config import HEAD, INSIDE, NOT_IN, TAIL, SetgenConfig, SetgenOptions
from nerserve.ner.archs.setgen.targets import batch_targets
from nerserve.ner.backbone import resolve_backbone
from nerserve.ner.data import read_split
from nerserve.ner.decoding.generation import Hypothesis
from nerserve.ner.loading import build_network, eager_program
from nerserve.ner.lora import LoraSettings
from nerserve.ner.types import Entity
from tests.serving import LOCATIONS

VOCABULARY = Vocabulary(("ADR", "Drug"))
P = VOCABULARY.first_pointer  # pointer to word 0
ADR, DRUG = VOCABULARY.type_id("ADR"), VOCABULARY.type_id("Drug")
# "severe muscle and joint pain": ADR "muscle … pain" (discontinuous) and ADR "joint pain"
GOLD = frozenset({Entity("ADR", ((1, 2), (4, 5))), Entity("ADR", ((3, 5),))})


def test_bartner_sequence_lists_every_word_of_every_entity_in_order() -> None:
    assert sequence_of(list(GOLD), VOCABULARY) == (START, P + 1, P + 4, ADR, P + 3, P + 4, ADR, END)


def test_setgen_targets_parts_counts_and_rows() -> None:
    config = SetgenConfig(labels=VOCABULARY.labels, negatives_per_sentence=2)
    targets = batch_targets([GOLD], [5], config, random.Random(0), IGNORE)
    assert targets.parts[0, :, HEAD].tolist() == [0, 1, 0, 1, 0]
    assert targets.parts[0, :, TAIL].tolist() == [0, 0, 0, 0, 1]
    assert targets.parts[0, :, INSIDE].tolist() == [0, 1, 0, 1, 1]
    assert targets.parts[0, :, NOT_IN].tolist() == [1, 0, 1, 0, 0]
    assert targets.counts[0].tolist() == [0, 1, 0, 1, 0]
    entity_rows = [r.tokens for r in targets.rows if r.tokens[1] != FRAGMENT and r.tokens[1] != NULL]
    assert entity_rows == [(P + 1, P + 4, ADR, END), (P + 3, P + 4, ADR, END)]
    negatives = {r.tokens for r in targets.rows} - set(entity_rows)
    assert negatives <= {(P + 0, NULL, END), (P + 2, NULL, END), (P + 4, FRAGMENT, END)} and len(negatives) == 2
    assert [r.first_position for r in targets.rows[:2]] == [4, 12]  # word index × τ (4)


def test_teacher_forcing_shifts_and_ignores_padding() -> None:
    from nerserve.ner.archs.pointer.targets import Row

    forced = teacher([Row(0, (START, P, ADR, END)), Row(1, (P + 2, NULL, END), 8)])
    assert forced.inputs.tolist() == [[START, P, ADR], [P + 2, NULL, END]]
    assert forced.targets.tolist() == [[P, ADR, END], [NULL, END, IGNORE]]
    assert forced.positions.tolist() == [[0, 1, 2], [8, 9, 10]]


def allowed_after(history: list[int], many: bool, length: int = 5) -> set[int]:
    logits = np.zeros((1, P + 6), dtype=np.float32)
    masked = Grammar(VOCABULARY, np.array([length]), many)(logits, np.array([history]))
    return set(np.flatnonzero(masked[0] > -1).tolist())


def test_grammar_setgen_one_entity_from_its_head() -> None:
    types_and_markers = {ADR, DRUG, FRAGMENT, NULL}
    assert allowed_after([P + 1], many=False) == types_and_markers | {P + 2, P + 3, P + 4}  # right of the head, in the sentence
    assert allowed_after([P + 1, P + 4], many=False) == types_and_markers  # nothing right of the last word
    assert allowed_after([P + 1, ADR], many=False) == {END}
    assert allowed_after([P + 1, NULL, END], many=False) == {END}


def test_grammar_bartner_groups_then_end() -> None:
    pointers = {P + w for w in range(5)}
    assert allowed_after([START], many=True) == pointers | {END}
    assert allowed_after([START, P + 3], many=True) == {P + 4, ADR, DRUG}  # a group closes with its type
    assert allowed_after([START, P + 3, ADR], many=True) == pointers | {END}


def test_parse_groups_makes_fragments_and_scores() -> None:
    log_probs = tuple(np.log([0.9, 0.8, 0.9, 0.5, 0.5, 1.0]).tolist())
    tokens = (P + 1, P + 4, ADR, P + 3, DRUG, END)
    entities = parse_groups(tokens, log_probs, VOCABULARY, [])
    assert [(e.type, e.fragments) for e in entities] == [("ADR", ((1, 2), (4, 5))), ("Drug", ((3, 4),))]
    assert entities[0].score == pytest.approx((0.9 * 0.8 * 0.9) ** (1 / 3))
    from_head = parse_groups((P + 2, P + 4, ADR, END), (0.0,) * 4, VOCABULARY, [1])
    assert [(e.type, e.fragments) for e in from_head] == [("ADR", ((1, 3), (4, 5)))]
    assert parse_groups((FRAGMENT, END), (0.0, 0.0), VOCABULARY, [1]) == []


def test_hypothesis_score_is_mean_log_probability() -> None:
    assert Hypothesis((P, END), (-1.0, -3.0)).score == -2.0


SENTENCES = [
    ["I", "had", "severe", "muscle", "and", "joint", "pain", "from", "Arthrotec", "."],
    ["Fine", "."],
    ["Lipitor", "gave", "me", "cramps", "in", "both", "legs", "and", "my", "back", "ached", "."],
]
TINY = {"encoder": {"lstm_hidden": 16, "char_filters": 8}, "decoder_dim": 32, "decoder_heads": 2, "decoder_ffn": 64}


@pytest.fixture(scope="module", params=["setgen", "bartner"])
def tiny_program(request: pytest.FixtureRequest, tiny_backbone: Path):  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    if request.param == "setgen":
        spec, config = (
            setgen.SPEC,
            SetgenConfig(labels=("ADR", "Drug"), decode=SetgenOptions(head_threshold=0.45, beams=3), **TINY),
        )
    else:
        spec, config = bartner.SPEC, BartnerConfig(labels=("ADR", "Drug"), decode=BartnerOptions(beams=2), **TINY)  # type: ignore[assignment]
    backbone = resolve_backbone(str(tiny_backbone))
    network = build_network(spec, config, backbone, LoraSettings(rank=2, alpha=4)).eval()
    return eager_program(spec, network, backbone, "cpu"), network


def test_sentences_do_not_depend_on_their_batch(tiny_program) -> None:  # type: ignore[no-untyped-def]
    tiny_program, _ = tiny_program
    together = tiny_program.predict(SENTENCES)
    assert any(together)  # random weights still write entities (the grammar keeps them parseable)
    for sentence, expected in zip(SENTENCES, together, strict=True):
        assert tiny_program.predict([sentence])[0].keys() == expected.keys()


def test_training_step_reaches_every_part(tiny_program) -> None:  # type: ignore[no-untyped-def]
    from nerserve.ner.archs.bartner.loss import bartner_loss
    from nerserve.ner.archs.setgen.loss import setgen_loss

    program, network = tiny_program
    batch = program.prepare(SENTENCES)
    inputs = {k: torch.from_numpy(v) for k, v in batch.encoder_inputs.items()}
    gold = [frozenset({Entity("ADR", ((3, 4), (6, 7)))}), frozenset(), frozenset({Entity("Drug", ((0, 1),))})]
    network.train()
    if isinstance(program.config, SetgenConfig):
        targets = batch_targets(gold, batch.lengths, program.config, random.Random(0), IGNORE)
        loss, parts = setgen_loss(network, inputs, targets)
        assert set(parts) == {"head", "count", "gen"}
        loss.backward()
        assert network.detectors.parts[0].weight.grad is not None
    else:
        loss, parts = bartner_loss(network, inputs, gold)
        loss.backward()
    network.eval()
    assert torch.isfinite(loss) and network.decoder.tokens.weight.grad is not None


def test_each_row_ends_at_its_own_length_limit() -> None:
    """BARTNER's bound is per sentence, not the batch's longest: a row at its limit may only end."""
    logits = np.zeros((2, P + 6), dtype=np.float32)
    history = np.array([[START, P + 1, ADR], [START, P + 1, ADR]])
    grammar = Grammar(VOCABULARY, np.array([5, 5]), many=True, limits=np.array([3, 10]))
    masked = grammar(logits, history)
    assert set(np.flatnonzero(masked[0] > -1).tolist()) == {END}
    assert END in set(np.flatnonzero(masked[1] > -1).tolist()) and P in set(np.flatnonzero(masked[1] > -1).tolist())


@pytest.mark.e2e  # loads a committed model
def test_beam_search_is_batch_invariant(data_root: Path) -> None:
    """A sentence's beams stop when its own hypotheses are done: alone or among longer sentences,
    the committed CADEC BARTNER model (beam 4) writes the same entities."""
    from nerserve.ner.loading import load_model

    program = load_model(LOCATIONS.model_dir("bartner-cadec"), "cpu").program
    assert program.config.decode.beams > 1
    sentences = [list(s.tokens) for s in read_split(data_root / "cadec", "test", limit=24)]
    assert program.predict(sentences) == [program.predict([s])[0] for s in sentences]
