"""GNER's pieces without a trained model: the target format and its parse, hierarchical matching
(Hunt–Szymanski = the DP table), the constrained decoding grammar, and the program end to end on
the real tokenizer (a random tiny network writes tags; the words and offsets must still be right)."""

import itertools
import random

import numpy as np
import pytest

from nerserve.ner.archs.gner.constraint import Constraint, SentenceGrammar, trie_of
from nerserve.ner.archs.gner.matching import align, greedy_subsequence, lcs_hunt_szymanski, lcs_table
from nerserve.ner.archs.gner.tagging import Markers, Tag, TagCodec, bio_entities, parse_pairs, squeeze, tags_of, target_ids
from nerserve.ner.backbone import resolve_backbone
from nerserve.ner.text.subword import SubwordEncoder, load_tokenizer


@pytest.fixture(scope="module")
def subwords() -> SubwordEncoder:
    return SubwordEncoder(load_tokenizer(resolve_backbone().path))


def markers_of(subwords: SubwordEncoder) -> Markers:
    return Markers.of(subwords.tokenizer, subwords.prefix[0], subwords.suffix[-1])


def test_target_round_trip(subwords: SubwordEncoder) -> None:
    words = ["EU", "rejects", "German", "call", "(", "point", "of", "interest", ")", "."]
    labels = ("organization", "point of interest", "miscellaneous")
    codec = TagCodec(subwords.tokenizer, labels)
    spans = [("organization", 0, 1), ("miscellaneous", 2, 3), ("point of interest", 5, 8)]
    tags = tags_of(len(words), spans)
    pieces = subwords.tokenize([words])[0].pieces
    ids = target_ids(pieces, tags, codec, markers_of(subwords))
    text = subwords.tokenizer.decode(ids)
    pairs = parse_pairs(text)
    assert [squeeze(w) for w, _ in pairs] == [squeeze(subwords.tokenizer.decode(list(p))) for p in pieces]
    assert [codec.read(t) for _, t in pairs] == tags  # "(" and ")" are words here, and still parse
    assert bio_entities([codec.read(t) for _, t in pairs]) == spans


def test_labels_outside_the_request_are_outside(subwords: SubwordEncoder) -> None:
    codec = TagCodec(subwords.tokenizer, ("person",))
    assert codec.read("b - person") == Tag(True, "person")
    assert codec.read("B-location") == Tag(False, None)
    assert bio_entities([Tag(False, "person"), Tag(False, "person"), Tag(True, "person")]) == [
        ("person", 0, 2),
        ("person", 2, 3),
    ]


def test_matching_tiers() -> None:
    words = ["a", "b", "c", "d"]
    assert align(words, ["a", "b", "c", "d"]) == ({0: 0, 1: 1, 2: 2, 3: 3}, "identical")
    assert align(words, ["a", "c"]) == ({0: 0, 2: 1}, "subsequence")
    matched, tier = align(words, ["a", "x", "c", "b", "d"])
    assert tier == "lcs" and len(matched) == 3 and matched[0] == 0 and matched[3] == 4
    assert greedy_subsequence(words, ["b", "a"]) is None


def test_hunt_szymanski_equals_the_table() -> None:
    rng = random.Random(3)
    for _ in range(300):
        words = [rng.choice("abcde") for _ in range(rng.randint(0, 25))]
        generated = [rng.choice("abcdef") for _ in range(rng.randint(0, 25))]
        fast, table = lcs_hunt_szymanski(words, generated), lcs_table(words, generated)
        assert len(fast) == len(table)
        assert all(words[i] == generated[j] for i, j in fast)
        assert all(a[0] < b[0] and a[1] < b[1] for a, b in itertools.pairwise(fast))


def test_constraint_forces_words_and_allows_only_request_tags(subwords: SubwordEncoder) -> None:
    markers = markers_of(subwords)
    codec = TagCodec(subwords.tokenizer, ("person", "location"))
    pieces = subwords.tokenize([["Peter", "lives"]])[0].pieces
    grammar = SentenceGrammar(pieces, trie_of(codec.sequences), markers)
    constraint = Constraint([grammar], np.zeros(1, dtype=np.int64))
    history = np.array([[markers.start]])
    rng = np.random.default_rng(0)
    written: list[int] = []
    for _ in range(grammar.steps(max(len(s) for s in codec.sequences))):
        (allowed,) = constraint.candidates(history)
        token = int(rng.choice(allowed))
        written.append(token)
        history = np.concatenate([history, [[token]]], axis=1)
        if token == markers.end:
            break
    assert written[-1] == markers.end
    pairs = parse_pairs(subwords.tokenizer.decode(written[:-1]))
    assert [w for w, _ in pairs] == ["peter", "lives"]
    assert all(squeeze(t) in {squeeze(subwords.tokenizer.decode(list(s))) for s in codec.sequences} for _, t in pairs)
