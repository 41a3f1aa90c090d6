"""Which candidate entities of one sentence survive: de-duplication, then best-first acceptance
under the model's overlap rule.

Candidates are `Entity` objects (type, word fragments, score): the same type every architecture
returns, so no architecture keeps its own tuple layout.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Literal

import numpy as np

from nerserve.ner.types import Entity, EntitySet, Fragment

# flat: no two entities share a word; nested: entities may nest but not cross; any: no rule
# (overlapping and discontinuous entities, e.g. CADEC).
Overlap = Literal["flat", "nested", "any"]


def crossing(a: Entity, b: Entity) -> bool:
    """Extents that overlap without one containing the other."""
    return a.start < b.start < a.end < b.end or b.start < a.start < b.end < a.end


def conflicts(a: Entity, b: Entity, overlap: Overlap) -> bool:
    if overlap == "flat":
        return a.overlaps(b)
    if overlap == "nested":
        return crossing(a, b)
    return False


def best_per(candidates: Iterable[Entity], key: Callable[[Entity], Hashable]) -> list[Entity]:
    """The best-scoring candidate of each key (the first one seen on a tie), in first-seen order."""
    best: dict[Hashable, Entity] = {}
    for candidate in candidates:
        k = key(candidate)
        if k not in best or candidate.score > best[k].score:
            best[k] = candidate
    return list(best.values())


def resolve(candidates: Iterable[Entity], threshold: float, overlap: Overlap) -> EntitySet:
    """Generated entities of one sentence: those scoring at least `threshold`, the best of each
    (type, fragments), then best-first acceptance under the overlap rule."""
    kept = best_per((e for e in candidates if e.score >= threshold), key=Entity.key)
    return accept_best_first(kept, overlap)


def accept_best_first(candidates: Iterable[Entity], overlap: Overlap, one_type_per_span: bool = False) -> EntitySet:
    """Greedy acceptance, best score first (stable on ties): a candidate that conflicts with an
    accepted one is dropped; with `one_type_per_span`, so is a second type for the same fragments."""
    accepted: list[Entity] = []
    taken: set[tuple[tuple[int, int], ...]] = set()
    for candidate in sorted(candidates, key=lambda e: -e.score):
        if one_type_per_span and candidate.fragments in taken:
            continue
        if any(conflicts(candidate, other, overlap) for other in accepted):
            continue
        taken.add(candidate.fragments)
        accepted.append(candidate)
    return EntitySet(accepted)


def spans_by_sentence(
    sentence: np.ndarray, starts: list[int], ends: list[int], sentences: int
) -> list[tuple[int, list[Fragment]]]:
    """A batch's candidates, ordered by sentence (as np.nonzero gives them): for each of `sentences`
    sentences, the index of its first candidate and its candidates' bounds."""
    first = np.searchsorted(sentence, np.arange(sentences + 1)).tolist()
    return [
        (first[b], list(zip(starts[first[b] : first[b + 1]], ends[first[b] : first[b + 1]], strict=True)))
        for b in range(sentences)
    ]


def accept_spans_best_first(
    bounds: Sequence[Fragment], scores: Sequence[float], overlap: Overlap, one_type_per_span: bool = False
) -> list[int]:
    """`accept_best_first` for candidates of one fragment each, given as plain bounds and scores
    (so that decoders make an Entity only for what survives): the accepted candidates' indices,
    best score first (stable on ties)."""
    accepted: list[int] = []
    taken: set[Fragment] = set()
    for index in sorted(range(len(bounds)), key=lambda i: -scores[i]):
        span = bounds[index]
        if one_type_per_span and span in taken:
            continue
        if overlap != "any" and any(spans_conflict(span, bounds[other], overlap) for other in accepted):
            continue
        taken.add(span)
        accepted.append(index)
    return accepted


def spans_conflict(a: Fragment, b: Fragment, overlap: Overlap) -> bool:
    """`conflicts` for two single-fragment extents."""
    (a_start, a_end), (b_start, b_end) = a, b
    if overlap == "flat":
        return a_start < b_end and b_start < a_end
    if overlap == "nested":
        return a_start < b_start < a_end < b_end or b_start < a_start < b_end < a_end
    return False
