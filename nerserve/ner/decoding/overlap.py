"""Which candidate entities of one sentence survive: de-duplication, then best-first acceptance
under the model's overlap rule.

Candidates are `Entity` objects (type, word fragments, score): the same type every architecture
returns, so no architecture keeps its own tuple layout. Decoders whose candidates are single spans
hand the same rule plain bounds and scores (`accept_spans_best_first`), and make an Entity only
for what it accepts.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Literal, TypeVar

import numpy as np

from nerserve.ner.types import Entity, EntitySet, Fragment

# flat: no two entities share a word; nested: entities may nest but not cross; any: no rule
# (overlapping and discontinuous entities, e.g. CADEC).
Overlap = Literal["flat", "nested", "any"]

Candidate = TypeVar("Candidate")


def spans_overlap(a: Fragment, b: Fragment) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def spans_cross(a: Fragment, b: Fragment) -> bool:
    """Extents that overlap without one containing the other."""
    return a[0] < b[0] < a[1] < b[1] or b[0] < a[0] < b[1] < a[1]


def crossing(a: Entity, b: Entity) -> bool:
    """Entities whose extents (first word to last) cross."""
    return spans_cross((a.start, a.end), (b.start, b.end))


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
    return accept_best_first(kept, overlap) if kept else EntitySet()


def best_first(
    candidates: Sequence[Candidate],
    scores: Sequence[float],
    conflict: Callable[[Candidate, Candidate], bool] | None,
    extent: Callable[[Candidate], Hashable] | None = None,
) -> list[int]:
    """Greedy acceptance, best score first (stable on ties): the indices of the candidates accepted.
    A candidate that conflicts with an accepted one is dropped; with `extent`, so is a second one
    of the same extent."""
    accepted: list[int] = []
    taken: set[Hashable] = set()
    for index in sorted(range(len(candidates)), key=lambda i: -scores[i]):
        candidate = candidates[index]
        if extent is not None and extent(candidate) in taken:
            continue
        if conflict is not None and any(conflict(candidate, candidates[other]) for other in accepted):
            continue
        if extent is not None:
            taken.add(extent(candidate))
        accepted.append(index)
    return accepted


def accept_best_first(candidates: Iterable[Entity], overlap: Overlap, one_type_per_span: bool = False) -> EntitySet:
    """`best_first` over entities under the overlap rule; with `one_type_per_span`, one entity of
    the same fragments."""
    listed = list(candidates)
    conflict = None if overlap == "any" else lambda a, b: conflicts(a, b, overlap)
    extent = (lambda e: e.fragments) if one_type_per_span else None
    return EntitySet(listed[i] for i in best_first(listed, [e.score for e in listed], conflict, extent))


SPAN_CONFLICTS: dict[Overlap, Callable[[Fragment, Fragment], bool] | None] = {
    "flat": spans_overlap,
    "nested": spans_cross,
    "any": None,
}


def accept_spans_best_first(
    bounds: Sequence[Fragment], scores: Sequence[float], overlap: Overlap, one_type_per_span: bool = False
) -> list[int]:
    """`accept_best_first` for candidates of one fragment each, given as bounds and scores: the
    indices of those accepted."""
    return best_first(bounds, scores, SPAN_CONFLICTS[overlap], (lambda span: span) if one_type_per_span else None)


def spans_by_sentence(sentence: np.ndarray, starts: list[int], ends: list[int]) -> list[tuple[int, int, list[Fragment]]]:
    """A batch's candidates, ordered by sentence (as np.nonzero gives them): for each sentence that
    has any (few do, once lone spans are taken), its number, the index of its first candidate and
    its candidates' bounds."""
    if not len(sentence):
        return []
    changes = (np.flatnonzero(np.diff(sentence)) + 1).tolist()
    firsts, lasts = [0, *changes], [*changes, len(sentence)]
    return [
        (b, lo, list(zip(starts[lo:hi], ends[lo:hi], strict=True)))
        for b, lo, hi in zip(sentence[firsts].tolist(), firsts, lasts, strict=True)
    ]


def lone_spans(
    sentence: np.ndarray, starts: np.ndarray, ends: np.ndarray, scores: np.ndarray, independent: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """A batch's single-span candidates (any order) that best-first acceptance takes as they are,
    under every overlap rule, with or without one type a span: the best of a span (the first on a
    tie) that overlaps no other candidate's span of its sentence, in sentences marked
    `independent` (where nothing else links spans apart). Their indices in order, and a mask of
    every candidate they settle (theirs and their span's others)."""
    order = np.lexsort((np.arange(len(sentence)), -scores, ends, starts, sentence))
    same_span = np.zeros(len(order), dtype=bool)
    same_span[1:] = (np.diff(sentence[order]) == 0) & (np.diff(starts[order]) == 0) & (np.diff(ends[order]) == 0)
    best = order[~same_span]  # one a span, by sentence, start, end
    span_sentence, span_start, span_end = sentence[best], starts[best], ends[best]
    # the furthest end of the sentence's spans before each (by start): a span overlaps an earlier one
    # where it starts before that, and a later one where the next span starts before it ends
    scale = int(ends.max(initial=0)) + 1
    furthest = np.maximum.accumulate(span_sentence * scale + span_end)
    earlier_end = np.concatenate(([-1], furthest[:-1])) - span_sentence * scale
    later_start = np.concatenate((span_start[1:], [scale]))
    later_start[np.concatenate((np.diff(span_sentence) != 0, [True]))] = scale
    alone = (span_start >= earlier_end) & (later_start >= span_end) & independent[span_sentence]
    span_of = np.empty(len(order), dtype=np.int64)
    span_of[order] = np.cumsum(~same_span) - 1
    return np.sort(best[alone]), alone[span_of]


def lone_entities(
    alone: np.ndarray,
    sentence: np.ndarray,
    starts: np.ndarray,
    ends: np.ndarray,
    classes: np.ndarray,
    scores: np.ndarray,
    labels: tuple[str, ...],
    sentences: int,
) -> list[list[Entity]]:
    """Per sentence, the entities of the candidates `lone_spans` took (class 0 is no entity)."""
    found: list[list[Entity]] = [[] for _ in range(sentences)]
    for b, start, end, kind, score in zip(*(a[alone].tolist() for a in (sentence, starts, ends, classes, scores)), strict=True):
        found[b].append(Entity(labels[kind - 1], ((start, end),), score))
    return found
