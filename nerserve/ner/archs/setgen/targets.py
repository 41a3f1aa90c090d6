"""Training targets of SetGNER: per word, which parts of entities it is (head / inside / tail /
none) and how many entities start there; one decoder row per entity from its head word, and a
few rows from words that head no entity (they write `fragment` or `null`)."""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

from nerserve.ner.archs.pointer.targets import Row, entity_pointers
from nerserve.ner.archs.pointer.vocabulary import END, FRAGMENT, NULL
from nerserve.ner.archs.setgen.config import HEAD, INSIDE, NOT_IN, TAIL, SetgenConfig
from nerserve.ner.archs.setgen.program import MAX_ENTITY_WORDS
from nerserve.ner.types import Entity


@dataclass
class SetgenTargets:
    parts: np.ndarray  # [B, N, 4] float32 (0/1 per part)
    counts: np.ndarray  # [B, N] int64, IGNORE beyond a sentence
    rows: list[Row]
    too_long: int  # entities left out of the decoder rows (more than MAX_ENTITY_WORDS words)


def batch_targets(
    gold: list[frozenset[Entity]], lengths: list[int], config: SetgenConfig, rng: random.Random, ignore: int
) -> SetgenTargets:
    vocabulary = config.vocabulary
    width = max(lengths)
    parts = np.zeros((len(gold), width, 4), dtype=np.float32)
    counts = np.full((len(gold), width), ignore, dtype=np.int64)
    rows: list[Row] = []
    too_long = 0
    for b, (entities, length) in enumerate(zip(gold, lengths, strict=True)):
        counts[b, :length] = 0
        inside: set[int] = set()
        for entity in sorted(entities, key=lambda e: (e.start, e.fragments, e.type)):
            words = sorted(entity.words())
            inside |= set(words)
            parts[b, entity.start, HEAD] = parts[b, entity.end - 1, TAIL] = 1.0
            counts[b, entity.start] = min(counts[b, entity.start] + 1, config.max_count)
            if len(words) > MAX_ENTITY_WORDS:
                too_long += 1
                continue
            tokens = (*entity_pointers(entity, vocabulary), vocabulary.type_id(entity.type), END)
            rows.append(Row(b, tokens, entity.start * config.position_interval))
        for word in range(length):
            parts[b, word, INSIDE if word in inside else NOT_IN] = 1.0
        heads = {e.start for e in entities}
        others = [w for w in range(length) if w not in heads]
        for word in rng.sample(others, min(config.negatives_per_sentence, len(others))):
            marker = FRAGMENT if word in inside else NULL
            rows.append(Row(b, (vocabulary.pointer(word), marker, END), word * config.position_interval))
    return SetgenTargets(parts, counts, rows, too_long)
