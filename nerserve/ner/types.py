"""Entities in word indices (inside) and in character offsets (outside).

Standard library only: every layer of the project may import this module.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

Fragment = tuple[int, int]  # word indices [start, end), end excluded


@dataclass(frozen=True, order=True)
class Entity:
    """One entity: a type and one or more sorted, non-touching word fragments.

    The score is not part of identity: two predictions of the same type and fragments are the
    same entity whatever their confidence, which is what strict set matching needs.
    """

    type: str
    fragments: tuple[Fragment, ...]
    score: float = field(default=1.0, compare=False)

    def __post_init__(self) -> None:
        if not self.fragments:
            raise ValueError("an entity needs at least one fragment")
        previous_end = -1
        for start, end in self.fragments:
            if start >= end:
                raise ValueError(f"empty or reversed fragment {(start, end)}")
            if start <= previous_end:
                raise ValueError(f"fragments must be sorted and must not touch: {self.fragments}")
            previous_end = end

    def __reduce__(self) -> tuple[Callable[..., Entity], tuple[str, tuple[Fragment, ...], float]]:
        # pickled as its three values: the engine process sends every answer to an HTTP worker,
        # and a dataclass's default pickling (its __dict__) takes four times as long
        return (Entity, (self.type, self.fragments, self.score))

    @property
    def start(self) -> int:
        return self.fragments[0][0]

    @property
    def end(self) -> int:
        return self.fragments[-1][1]

    @property
    def is_discontinuous(self) -> bool:
        return len(self.fragments) > 1

    def key(self) -> tuple[str, tuple[Fragment, ...]]:
        """The identity used by strict matching."""
        return (self.type, self.fragments)

    def words(self) -> set[int]:
        return {i for start, end in self.fragments for i in range(start, end)}

    def overlaps(self, other: Entity) -> bool:
        if len(self.fragments) == 1 and len(other.fragments) == 1:  # two spans: no word sets needed
            return self.start < other.end and other.start < self.end
        return bool(self.words() & other.words())


class EntitySet(frozenset[Entity]):
    """A set of entities of one sentence: order carries no meaning."""

    def keys(self) -> set[tuple[str, tuple[Fragment, ...]]]:
        return {entity.key() for entity in self}


class Word(NamedTuple):
    """A word of a text with its character offsets [start, end) in Unicode code points. A named
    tuple rather than a dataclass: every request makes one per word, and a tuple is made in half
    the time."""

    text: str
    start: int
    end: int


def fragments_of(words: list[int]) -> tuple[Fragment, ...]:
    """Increasing word indices → maximal runs of consecutive words (several: a discontinuous entity)."""
    fragments: list[list[int]] = []
    for word in words:
        if fragments and fragments[-1][1] == word:
            fragments[-1][1] = word + 1
        else:
            fragments.append([word, word + 1])
    return tuple((a, b) for a, b in fragments)


def fragment_char_spans(fragments: tuple[Fragment, ...], words: list[Word]) -> list[tuple[int, int]]:
    """Character spans of an entity's fragments: from its first word's start to its last word's end."""
    return [(words[start].start, words[end - 1].end) for start, end in fragments]
