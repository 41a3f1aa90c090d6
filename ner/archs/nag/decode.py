"""NAG-NER decoding in numpy: generated token sequences → typed word fragments.

A sequence is cut at its first `</s>`. Its second token is the type (or `<O>`: no entity); the
rest must be pointers that, read left to right from the query's start word, cover whole words in
increasing order. Skipped words split the entity into fragments (a discontinuous mention).
Sequences that cannot be mapped are dropped and counted.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np

from ner.archs.nag.config import EOS, OUTSIDE, SPECIALS, NagConfig, NagDecodeOptions
from ner.types import Entity, EntitySet, Fragment


def words_of_pointers(
    positions: list[int], start_word: int, pieces: list[list[int]], word_of: dict[int, int]
) -> list[int] | None:
    """Word indices the sub-word positions spell out, or None when they do not spell whole words
    left to right from the start word."""
    words: list[int] = []
    i = 0
    while i < len(positions):
        word = word_of.get(positions[i])
        if word is None or (words and word <= words[-1]) or (not words and word != start_word):
            return None
        need = pieces[word]
        if positions[i : i + len(need)] != need:
            return None
        words.append(word)
        i += len(need)
    return words or None


def fragments_of(words: list[int]) -> tuple[Fragment, ...]:
    fragments: list[list[int]] = []
    for word in words:
        if fragments and fragments[-1][1] == word:
            fragments[-1][1] = word + 1
        else:
            fragments.append([word, word + 1])
    return tuple((a, b) for a, b in fragments)


def parse_query(
    ids: np.ndarray, probs: np.ndarray, start_word: int, pieces: list[list[int]], word_of: dict[int, int], config: NagConfig
) -> tuple[Entity | None, str]:
    """One generated sequence → (entity, outcome) with outcome in entity / outside / unmapped."""
    tag = int(ids[1])
    if tag == OUTSIDE:
        return None, "outside"
    if not len(SPECIALS) <= tag < config.fixed_vocabulary:
        return None, "unmapped"
    positions: list[int] = []
    end = None
    for slot in range(2, len(ids)):
        token = int(ids[slot])
        if token == EOS:
            end = slot
            break
        if token < config.fixed_vocabulary:
            return None, "unmapped"
        positions.append(token - config.fixed_vocabulary)
    if end is None:
        return None, "unmapped"
    words = words_of_pointers(positions, start_word, pieces, word_of)
    if words is None:
        return None, "unmapped"
    score = math.exp(float(np.log(np.maximum(probs[1 : end + 1], 1e-12)).mean()))
    return Entity(config.labels[tag - len(SPECIALS)], fragments_of(words), score), "entity"


def resolve_overlaps(entities: list[Entity], options: NagDecodeOptions) -> EntitySet:
    """Same entity from two queries: keep the best score. Flat models: no shared words."""
    best: dict[tuple[str, tuple[Fragment, ...]], Entity] = {}
    for entity in entities:
        if entity.score >= options.threshold and (entity.key() not in best or entity.score > best[entity.key()].score):
            best[entity.key()] = entity
    if options.overlap != "flat":
        return EntitySet(best.values())
    kept: list[Entity] = []
    for entity in sorted(best.values(), key=lambda e: -e.score):
        if not any(entity.overlaps(other) for other in kept):
            kept.append(entity)
    return EntitySet(kept)


def decode_queries(
    token_ids: np.ndarray,
    token_probs: np.ndarray,
    queries: list[tuple[int, int]],
    pieces: list[list[list[int]]],
    config: NagConfig,
    options: list[NagDecodeOptions],
    outcomes: Counter[str],
) -> list[EntitySet]:
    """All queries of a batch ((sentence, start word) each) → one entity set per sentence."""
    word_of = [{p: w for w, wp in enumerate(sentence) for p in wp} for sentence in pieces]
    found: list[list[Entity]] = [[] for _ in pieces]
    for q, (sentence, start_word) in enumerate(queries):
        entity, outcome = parse_query(token_ids[q], token_probs[q], start_word, pieces[sentence], word_of[sentence], config)
        outcomes[outcome] += 1
        if entity is not None:
            found[sentence].append(entity)
    return [resolve_overlaps(entities, options[b]) for b, entities in enumerate(found)]
