"""Training targets of NAG-NER: per-word entity-start counts and one token sequence per query.

Entities starting at the same word are ranked by spanning length (shortest first, as in the
paper), so query (word j, rank n) writes the n-th shortest. A word with no entity may be drawn as
a negative query that writes `<O>` and the word itself.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field

from nerserve.ner.archs.nag.config import BOS, EOS, OUTSIDE, PAD, NagConfig
from nerserve.ner.types import Entity

IGNORE = -100  # cross-entropy ignore index


@dataclass
class Query:
    sentence: int
    word: int
    rank: int
    tokens: list[int]  # <s> TAG pointers… </s>, padded to the decoder length


@dataclass
class BatchTargets:
    counts: list[list[int]]  # per sentence, per word: entities starting there (≤ o_max)
    queries: list[Query]
    skipped: Counter[str] = field(default_factory=Counter)


def pointer_tokens(entity: Entity, pieces: list[list[int]], config: NagConfig) -> list[int]:
    """The entity's sub-words, left to right over its fragments, as pointer tokens."""
    return [config.fixed_vocabulary + p for start, end in entity.fragments for w in range(start, end) for p in pieces[w]]


def spanning_rank_key(entity: Entity) -> tuple[int, int, tuple[tuple[int, int], ...], str]:
    return (entity.end - entity.start, entity.end, entity.fragments, entity.type)


def padded(tokens: list[int], length: int) -> list[int]:
    return tokens + [PAD] * (length - len(tokens))


def batch_targets(
    entities: list[frozenset[Entity]], pieces: list[list[list[int]]], config: NagConfig, rng: random.Random
) -> BatchTargets:
    targets = BatchTargets(counts=[], queries=[])
    for b, (gold, word_pieces) in enumerate(zip(entities, pieces, strict=True)):
        by_start: dict[int, list[Entity]] = {}
        for entity in gold:
            if len(pointer_tokens(entity, word_pieces, config)) > config.l_max:
                targets.skipped["longer_than_l_max"] += 1
                continue
            by_start.setdefault(entity.start, []).append(entity)
        counts = [0] * len(word_pieces)
        for start, starting in sorted(by_start.items()):
            starting.sort(key=spanning_rank_key)
            if len(starting) > config.o_max:
                targets.skipped["more_than_o_max"] += len(starting) - config.o_max
            for rank, entity in enumerate(starting[: config.o_max]):
                tokens = [BOS, config.type_id(entity.type), *pointer_tokens(entity, word_pieces, config), EOS]
                targets.queries.append(Query(b, start, rank, padded(tokens, config.length)))
            counts[start] = min(len(starting), config.o_max)
        free = [w for w, c in enumerate(counts) if c == 0]
        for word in rng.sample(free, min(len(free), config.negatives_per_sentence)):
            own = [config.fixed_vocabulary + p for p in word_pieces[word]][: config.l_max]
            targets.queries.append(Query(b, word, 0, padded([BOS, OUTSIDE, *own, EOS], config.length)))
        targets.counts.append(counts)
    return targets


def coverage(entities: list[frozenset[Entity]], pieces: list[list[list[int]]], l_max: int) -> dict[str, float]:
    """Share of entities whose sub-words fit in l_max (reported with every trained model)."""
    lengths = [
        sum(len(wp[w]) for s, e in ent.fragments for w in range(s, e))
        for gold, wp in zip(entities, pieces, strict=True)
        for ent in gold
    ]
    if not lengths:
        return {"entities": 0, "covered": 1.0, "longest": 0}
    return {
        "entities": len(lengths),
        "covered": sum(n <= l_max for n in lengths) / len(lengths),
        "longest": max(lengths),
    }
