"""NAG-NER decoding in numpy: generated token sequences → typed word fragments.

A sequence is cut at its first `</s>`. Its second token is the type (or `<O>`: no entity); the
rest must be pointers which, read left to right, name words in increasing order from the query's
start word. Skipped words split the entity into fragments (a discontinuous mention).

Each pointer stands for the word it points into. A non-autoregressive decoder writes all slots at
once, so its typical slips are the known ones of parallel decoding — a sub-word written twice, or
one of a word's sub-words left out ("muscle" = mus ##cle written as mus ##cle ##cle, or mus) —
and they do not change which words are meant: such sequences are mapped, and counted as
"merged" apart from the "exact" ones. Sequences whose words do not start at the start word or go
backwards cannot be mapped: they are dropped and counted ("unmapped").
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable

import numpy as np

from nerserve.ner.archs.nag.config import EOS, OUTSIDE, SPECIALS, NagConfig, NagDecodeOptions
from nerserve.ner.decoding.overlap import resolve
from nerserve.ner.types import Entity, EntitySet, fragments_of


def words_of_pointers(
    positions: list[int], start_word: int, pieces: list[list[int]], word_of: dict[int, int]
) -> tuple[list[int], bool] | None:
    """(word indices the sub-word positions name, whether they spell those words exactly), or
    None when they do not go left to right from the start word."""
    words: list[int] = []
    for position in positions:
        word = word_of.get(position)
        if word is None or (not words and word != start_word):
            return None
        if words and word == words[-1]:
            continue
        if words and word < words[-1]:
            return None
        words.append(word)
    if not words:
        return None
    exact = positions == [p for word in words for p in pieces[word]]
    return words, exact


def parse_query(
    ids: list[int], log_probs: np.ndarray, start_word: int, pieces: list[list[int]], word_of: dict[int, int], config: NagConfig
) -> tuple[Entity | None, str]:
    """One generated sequence (its token ids, and the logs of their probabilities) → (entity,
    outcome) with outcome in exact / merged / outside / unmapped."""
    tag = ids[1]
    if tag == OUTSIDE:
        return None, "outside"
    fixed = config.fixed_vocabulary
    if not len(SPECIALS) <= tag < fixed:
        return None, "unmapped"
    try:
        end = ids.index(EOS, 2)
    except ValueError:
        return None, "unmapped"
    positions = [token - fixed for token in ids[2:end]]
    if any(position < 0 for position in positions):  # a special or a type where pointers belong
        return None, "unmapped"
    mapped = words_of_pointers(positions, start_word, pieces, word_of)
    if mapped is None:
        return None, "unmapped"
    words, exact = mapped
    score = math.exp(float(log_probs[1 : end + 1].mean()))
    return Entity(config.labels[tag - len(SPECIALS)], fragments_of(words), score), "exact" if exact else "merged"


def resolve_overlaps(entities: list[Entity], options: NagDecodeOptions) -> EntitySet:
    """Same entity from two queries: keep the best score; then the model's overlap rule."""
    return resolve(entities, options.threshold, options.overlap)


def decode_queries(
    token_ids: np.ndarray,
    token_probs: np.ndarray,
    queries: list[tuple[int, int]],
    pieces_of: Callable[[int], list[list[int]]],
    sentences: int,
    config: NagConfig,
    options: list[NagDecodeOptions],
    outcomes: Counter[str],
) -> list[EntitySet]:
    """All queries of a batch ((sentence, start word) each) → one entity set for each of `sentences`;
    `pieces_of(b)`: per word of sentence b, its sub-word positions (asked only for sentences with
    queries)."""
    maps: dict[int, tuple[list[list[int]], dict[int, int]]] = {}
    found: list[list[Entity]] = [[] for _ in range(sentences)]
    # as Python numbers, and the logs of every probability: one conversion for the batch
    ids, log_probs = token_ids.tolist(), np.log(np.maximum(token_probs, 1e-12))
    for q, (sentence, start_word) in enumerate(queries):
        if sentence not in maps:
            pieces = pieces_of(sentence)
            maps[sentence] = (pieces, {p: w for w, wp in enumerate(pieces) for p in wp})
        entity, outcome = parse_query(ids[q], log_probs[q], start_word, *maps[sentence], config)
        outcomes[outcome] += 1
        if entity is not None:
            found[sentence].append(entity)
    return [resolve_overlaps(entities, options[b]) for b, entities in enumerate(found)]
