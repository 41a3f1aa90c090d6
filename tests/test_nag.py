"""NAG-NER's pieces: training targets, mapping generated sequences onto words (discontinuous
included, unmappable ones dropped and counted), query selection, and batch independence on a tiny
random backbone."""

import random
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from nerserve.ner.archs.nag import SPEC
from nerserve.ner.archs.nag.config import BOS, EOS, OUTSIDE, PAD, NagConfig, NagDecodeOptions
from nerserve.ner.archs.nag.decode import decode_queries, parse_query
from nerserve.ner.archs.nag.targets import batch_targets
from nerserve.ner.backbone import resolve_backbone
from nerserve.ner.loading import build_network, eager_program
from nerserve.ner.lora import LoraSettings
from nerserve.ner.types import Entity, fragments_of

CONFIG = NagConfig(labels=("ADR", "Drug"), l_max=4)
V = CONFIG.fixed_vocabulary  # first pointer token
# words: "severe"=[1], "muscle"=[2, 3], "and"=[4], "pain"=[5]
PIECES = [[1], [2, 3], [4], [5]]
WORD_OF = {p: w for w, ps in enumerate(PIECES) for p in ps}


LOGS_OF_0_9 = np.log(np.full(CONFIG.length, 0.9, dtype=np.float32))  # every token's probability 0.9


def sequence(*tokens: int) -> list[int]:
    return [*tokens] + [PAD] * (CONFIG.length - len(tokens))


def test_discontinuous_sequence_maps_to_fragments() -> None:
    ids = sequence(BOS, CONFIG.type_id("ADR"), V + 2, V + 3, V + 5, EOS)
    entity, outcome = parse_query(ids, LOGS_OF_0_9, 1, PIECES, WORD_OF, CONFIG)
    assert outcome == "exact" and entity is not None
    assert entity.type == "ADR" and entity.fragments == ((1, 2), (3, 4))
    assert entity.score == pytest.approx(0.9)


@pytest.mark.parametrize(
    ("ids", "start", "outcome"),
    [
        (sequence(BOS, OUTSIDE, V + 1, EOS), 0, "outside"),
        (sequence(BOS, CONFIG.type_id("ADR"), V + 1, EOS), 2, "unmapped"),  # not the start word
        (sequence(BOS, CONFIG.type_id("ADR"), V + 5, V + 1, EOS), 3, "unmapped"),  # right to left
        (sequence(BOS, CONFIG.type_id("ADR"), V + 1, V + 4), 0, "unmapped"),  # no </s>
        (sequence(BOS, CONFIG.type_id("ADR"), V + 1, OUTSIDE, EOS), 0, "unmapped"),  # a tag inside
        (sequence(BOS, CONFIG.type_id("ADR"), EOS), 0, "unmapped"),  # empty
    ],
)
def test_unmappable_sequences_are_counted(ids: list[int], start: int, outcome: str) -> None:
    entity, got = parse_query(ids, LOGS_OF_0_9, start, PIECES, WORD_OF, CONFIG)
    assert entity is None and got == outcome


@pytest.mark.parametrize(
    "pointers",
    [
        (V + 2, EOS),  # half of "muscle"
        (V + 2, V + 3, V + 3, EOS),  # its last sub-word written twice
        (V + 3, V + 2, EOS),  # its sub-words swapped: still the one word
    ],
)
def test_sub_word_slips_map_to_whole_words(pointers: tuple[int, ...]) -> None:
    entity, outcome = parse_query(sequence(BOS, CONFIG.type_id("ADR"), *pointers), LOGS_OF_0_9, 1, PIECES, WORD_OF, CONFIG)
    assert outcome == "merged" and entity is not None and entity.fragments == ((1, 2),)


def test_flat_rule_and_duplicates() -> None:
    token_ids = np.stack(
        [
            sequence(BOS, CONFIG.type_id("ADR"), V + 2, V + 3, V + 4, V + 5, EOS),
            sequence(BOS, CONFIG.type_id("ADR"), V + 5, EOS),
            sequence(BOS, CONFIG.type_id("ADR"), V + 5, EOS),
        ]
    )
    probs = np.stack([np.full(CONFIG.length, p) for p in (0.6, 0.9, 0.8)])
    queries = [(0, 1), (0, 3), (0, 3)]
    outcomes: Counter[str] = Counter()
    flat = decode_queries(
        token_ids, probs, queries, [PIECES].__getitem__, 1, CONFIG, [NagDecodeOptions(overlap="flat")], outcomes
    )
    assert [e.fragments for e in flat[0]] == [((3, 4),)]
    anything = decode_queries(
        token_ids, probs, queries, [PIECES].__getitem__, 1, CONFIG, [NagDecodeOptions(overlap="any")], outcomes
    )
    assert {e.fragments for e in anything[0]} == {((1, 4),), ((3, 4),)}
    assert outcomes["exact"] == 6


def test_fragments_of_words() -> None:
    assert fragments_of([0, 1, 3, 5, 6]) == ((0, 2), (3, 4), (5, 7))


def test_targets_rank_by_spanning_length_and_sample_negatives() -> None:
    gold = frozenset(
        {
            Entity("ADR", ((1, 2), (3, 4))),  # spans 3 words
            Entity("ADR", ((1, 2),)),
            Entity("Drug", ((0, 1),)),
        }
    )
    targets = batch_targets([gold], [PIECES], CONFIG, random.Random(0))
    assert targets.counts == [[1, 2, 0, 0]]
    positives = [q for q in targets.queries if q.tokens[1] != OUTSIDE]
    assert [(q.word, q.rank) for q in positives] == [(0, 0), (1, 0), (1, 1)]
    assert positives[1].tokens[:5] == [BOS, CONFIG.type_id("ADR"), V + 2, V + 3, EOS]
    assert positives[2].tokens[:6] == [BOS, CONFIG.type_id("ADR"), V + 2, V + 3, V + 5, EOS]
    negatives = [q for q in targets.queries if q.tokens[1] == OUTSIDE]
    assert {q.word for q in negatives} == {2, 3}  # every free word (fewer than the sample size)
    assert all(len(q.tokens) == CONFIG.length for q in targets.queries)
    too_long = batch_targets([frozenset({Entity("ADR", ((0, 4),))})], [[[1], [2, 3], [4, 5], [6]]], CONFIG, random.Random(0))
    assert too_long.skipped["longer_than_l_max"] == 1 and too_long.counts == [[0, 0, 0, 0]]


SENTENCES = [
    ["I", "had", "severe", "muscle", "and", "joint", "pain", "after", "Lipitor", "."],
    ["Stomach", "cramps"],
    ["No", "side", "effects", "so", "far", "with", "Arthrotec", "50", "."],
]


@pytest.fixture(scope="module")
def tiny_program(tiny_backbone: Path):
    torch.manual_seed(0)
    config = NagConfig(
        labels=("ADR", "Drug"),
        encoder={"lstm_hidden": 16, "char_filters": 8},
        decoder_dim=32,
        decoder_heads=2,
        decoder_ffn=64,
        decode=NagDecodeOptions(start_threshold=0.9),
    )
    backbone = resolve_backbone(str(tiny_backbone))
    network = build_network(SPEC, config, backbone, LoraSettings(rank=2, alpha=4)).eval()
    return eager_program(SPEC, network, backbone, "cpu")


def test_queries_follow_start_counts(tiny_program) -> None:
    batch = tiny_program.prepare(SENTENCES)
    probs = np.zeros((3, batch.encoder_inputs["word_mask"].shape[1], 6), dtype=np.float32)
    probs[..., 0] = 1.0
    probs[0, 2] = [0.1, 0.1, 0.7, 0.1, 0.0, 0.0]  # "severe": two entities start here
    probs[1, 1] = [0.4, 0.6, 0.0, 0.0, 0.0, 0.0]  # "cramps": p(0) too high for τ_s = 0.3
    probs[2, 6] = [0.2, 0.8, 0.0, 0.0, 0.0, 0.0]  # "Arthrotec": one
    queries = tiny_program.select_queries(batch, probs, np.full(3, 0.3, dtype=np.float32))
    assert queries["query_sentence"].tolist() == [0, 0, 2]
    assert queries["query_word"].tolist() == [2, 2, 6]
    assert queries["query_rank"].tolist() == [0, 1, 0]
    assert queries["query_position"].tolist() == [batch.pieces[0][2][0], batch.pieces[0][2][0], batch.pieces[2][6][0]]


def test_outputs_do_not_depend_on_batch(tiny_program) -> None:
    together = tiny_program.prepare(SENTENCES)
    outputs = tiny_program.run(together)
    assert len(outputs["query_sentence"]) > 0  # τ_s = 0.9 selects starts on random weights
    decoded = tiny_program.decode(together, outputs)
    for b, sentence in enumerate(SENTENCES):
        alone_batch = tiny_program.prepare([sentence])
        alone = tiny_program.run(alone_batch)
        mine = outputs["query_sentence"] == b
        np.testing.assert_allclose(
            alone["start_probs"][0, : len(sentence)], outputs["start_probs"][b, : len(sentence)], atol=1e-5
        )
        np.testing.assert_array_equal(alone["token_ids"], outputs["token_ids"][mine])
        np.testing.assert_allclose(alone["token_probs"], outputs["token_probs"][mine], atol=1e-5)
        assert tiny_program.decode(alone_batch, alone)[0].keys() == decoded[b].keys()


def test_loss_trains_the_decoder_and_start_head(tiny_program) -> None:
    from nerserve.ner.archs.nag.loss import nag_loss

    network = tiny_program.graphs["decoder"].module  # EagerGraph over the network's decoder
    full = tiny_program.graphs["encoder"].module  # NagEncoderGraph(encoder, head)
    batch = tiny_program.prepare(SENTENCES)
    inputs = {k: torch.from_numpy(v) for k, v in batch.encoder_inputs.items()}
    gold = [frozenset({Entity("ADR", ((2, 4), (6, 7)))}), frozenset(), frozenset({Entity("Drug", ((6, 8),))})]
    targets = batch_targets(gold, batch.pieces, tiny_program.config, random.Random(0))

    class Parts(torch.nn.Module):  # the attributes nag_loss reads from a NagNetwork
        def __init__(self) -> None:
            super().__init__()
            self.encoder, self.head, self.decoder = full.encoder, full.head, network

    loss, parts = nag_loss(Parts(), inputs, targets)  # type: ignore[arg-type]
    assert torch.isfinite(loss) and set(parts) == {"gen", "start"}
    loss.backward()
    assert network.slots.grad is not None and full.head.start[0].weight.grad is not None
