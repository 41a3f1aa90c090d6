"""Teacher-forced training rows for the pointer decoder (stdlib + numpy), shared by setgen and
bartner: each row is one token sequence of one sentence, with the positions its tokens sit at."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from nerserve.ner.archs.pointer.vocabulary import END, START, Vocabulary
from nerserve.ner.types import Entity

IGNORE = -100  # cross-entropy ignore index


@dataclass(frozen=True)
class Row:
    sentence: int
    tokens: tuple[int, ...]  # the given first token, then the tokens to predict (end included)
    first_position: int = 0


def entity_pointers(entity: Entity, vocabulary: Vocabulary) -> list[int]:
    """Pointers to every word of the entity, left to right over its fragments."""
    return [vocabulary.pointer(w) for start, end in entity.fragments for w in range(start, end)]


def sequence_of(entities: list[Entity], vocabulary: Vocabulary) -> tuple[int, ...]:
    """BARTNER's target: `<s>`, then per entity (by start, end, type) its pointers and its type, then `</s>`."""
    tokens = [START]
    for entity in sorted(entities, key=lambda e: (e.start, e.end, e.fragments, e.type)):
        tokens += [*entity_pointers(entity, vocabulary), vocabulary.type_id(entity.type)]
    return (*tokens, END)


@dataclass(frozen=True)
class Teacher:
    """Rows as padded arrays: inputs (all tokens but the last), targets (all but the first; pads
    ignored) and positions."""

    sentence: np.ndarray  # [R]
    inputs: np.ndarray  # [R, T]
    targets: np.ndarray  # [R, T]
    positions: np.ndarray  # [R, T]


def teacher(rows: list[Row]) -> Teacher:
    steps = max(len(r.tokens) for r in rows) - 1
    inputs = np.full((len(rows), steps), END, dtype=np.int64)
    targets = np.full((len(rows), steps), IGNORE, dtype=np.int64)
    for i, row in enumerate(rows):
        inputs[i, : len(row.tokens) - 1] = row.tokens[:-1]
        targets[i, : len(row.tokens) - 1] = row.tokens[1:]
    positions = np.array([r.first_position for r in rows], dtype=np.int64)[:, None] + np.arange(steps)[None, :]
    return Teacher(np.array([r.sentence for r in rows], dtype=np.int64), inputs, targets, positions)
