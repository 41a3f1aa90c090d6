"""Span decoding in numpy: the graph's candidates (its filter applied) → typed → dedup → Soft-NMS →
threshold → overlap rule.

Soft-NMS follows the paper's Algorithm 1 (decay the score of every later proposal whose IoU with
the current one is ≥ k by u, keep the list sorted), not the official code's reordering quirk.
Soft-NMS only lowers scores, so candidates at or below δ are dropped before it: exact, and cheap.
Candidates are plain bounds, type indices and scores until the overlap rule has chosen: an Entity
is made only for what survives.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from nerserve.ner.archs.span.config import DecodeOptions
from nerserve.ner.decoding.overlap import accept_spans_best_first, lone_entities, lone_spans, spans_by_sentence
from nerserve.ner.types import Entity, EntitySet, Fragment


def decode_batch(
    candidates: np.ndarray,
    spans: np.ndarray,
    class_probs: np.ndarray,
    labels: tuple[str, ...],
    options: list[DecodeOptions],
) -> list[EntitySet]:
    """Every sentence of a batch, from the span-proposal graph's candidates (the seeds its filter
    passed: [M, 2] sentence and seed, sentence by sentence; [M, 2] adjusted spans; [M, C+1] class
    probabilities): the candidate tests run once over the batch; a span that overlaps no other
    candidate of its sentence is taken as it is (nearly every one), the rest go through Soft-NMS and
    the overlap rule sentence by sentence."""
    sentence = candidates[:, 0]
    classes = class_probs.argmax(axis=-1)
    scores = class_probs[np.arange(len(classes)), classes]
    thresholds = np.array([o.threshold for o in options], dtype=scores.dtype)
    typed = (classes > 0) & (scores > thresholds[sentence])
    sentence, classes, scores, kept = sentence[typed], classes[typed], scores[typed], spans[typed]
    starts, ends = kept[:, 0], kept[:, 1]
    # Soft-NMS decays only a proposal whose IoU with a kept one reaches k: an overlapping one, where k > 0
    alone, settled = lone_spans(sentence, starts, ends, scores, np.array([o.nms_iou > 0 for o in options]))
    found = lone_entities(alone, sentence, starts, ends, classes, scores, labels, len(options))
    rest = ~settled
    sentence, classes, scores = sentence[rest], classes[rest], scores[rest]
    # as Python numbers: one conversion per array, not one per value
    types, kept_scores = (classes - 1).tolist(), scores.tolist()
    for b, lo, bounds in spans_by_sentence(sentence, starts[rest].tolist(), ends[rest].tolist()):
        found[b].extend(survivors(bounds, types[lo : lo + len(bounds)], kept_scores[lo : lo + len(bounds)], labels, options[b]))
    return [EntitySet(entities) for entities in found]


def survivors(
    bounds: Sequence[Fragment], types: Sequence[int], scores: Sequence[float], labels: tuple[str, ...], options: DecodeOptions
) -> EntitySet:
    """One sentence's candidates: the best type of each span, Soft-NMS, the threshold again
    (Soft-NMS lowers scores), then the overlap rule."""
    if not bounds:
        return EntitySet()
    best: dict[Fragment, int] = {}  # the best candidate of each span, the first one on a tie
    for index, span in enumerate(bounds):
        seen = best.get(span)
        if seen is None or scores[index] > scores[seen]:
            best[span] = index
    chosen = list(best.values())
    unique = [bounds[i] for i in chosen]
    kept, decayed = soft_nms(unique, [scores[i] for i in chosen], options.nms_decay, options.nms_iou)
    passed = [i for i in kept if decayed[i] > options.threshold]
    accepted = accept_spans_best_first([unique[i] for i in passed], [decayed[i] for i in passed], options.overlap)
    return EntitySet(Entity(labels[types[chosen[i]]], (unique[i],), decayed[i]) for i in (passed[a] for a in accepted))


def soft_nms(
    bounds: Sequence[Fragment], scores: Sequence[float], decay: float, iou_threshold: float
) -> tuple[list[int], list[float]]:
    """Best first: every later proposal whose IoU with the one taken is ≥ the threshold has its score
    multiplied by `decay`, and the rest are re-sorted (stably). The proposals' indices in the order
    taken, and every proposal's score after decay."""
    decayed = list(scores)
    pending = sorted(range(len(bounds)), key=lambda i: -decayed[i])
    kept: list[int] = []
    while pending:
        current = pending.pop(0)
        kept.append(current)
        start, end = bounds[current]
        for i in pending:
            other_start, other_end = bounds[i]
            inter = min(end, other_end) - max(start, other_start)
            overlap = inter / ((end - start) + (other_end - other_start) - inter) if inter > 0 else 0.0
            if overlap >= iou_threshold:
                decayed[i] *= decay
        pending.sort(key=lambda i: -decayed[i])
    return kept, decayed
