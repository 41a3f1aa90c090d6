"""Span decoding in numpy: filter mask → typed candidates → dedup → Soft-NMS → threshold → overlap rule.

Soft-NMS follows the paper's Algorithm 1 (decay the score of every later proposal whose IoU with
the current one is ≥ k by u, keep the list sorted), not the official code's reordering quirk.
Soft-NMS only lowers scores, so candidates at or below δ are dropped before it: exact, and cheap.
"""

from __future__ import annotations

import numpy as np

from ner.archs.span.config import DecodeOptions
from ner.types import Entity, EntitySet

Candidate = tuple[int, int, int, float]  # start, end (excluded), class index, score


def iou(a: tuple[int, int], b: tuple[int, int]) -> float:
    inter = min(a[1], b[1]) - max(a[0], b[0])
    if inter <= 0:
        return 0.0
    return inter / ((a[1] - a[0]) + (b[1] - b[0]) - inter)


def candidates(
    filter_prob: np.ndarray, spans: np.ndarray, class_probs: np.ndarray, seed_mask: np.ndarray, options: DecodeOptions
) -> list[Candidate]:
    """One sentence: [K], [K, 2], [K, C+1], [K] → candidates above δ, one per distinct span."""
    classes = class_probs.argmax(axis=-1)
    scores = class_probs.max(axis=-1)
    keep = (seed_mask > 0) & (filter_prob > options.filter_threshold) & (classes > 0) & (scores > options.threshold)
    best: dict[tuple[int, int], Candidate] = {}
    for k in np.flatnonzero(keep):
        start, end = int(spans[k, 0]), int(spans[k, 1])
        score = float(scores[k])
        previous = best.get((start, end))
        if previous is None or score > previous[3]:
            best[(start, end)] = (start, end, int(classes[k]), score)
    return list(best.values())


def soft_nms(items: list[Candidate], decay: float, iou_threshold: float) -> list[Candidate]:
    pending = sorted(items, key=lambda c: -c[3])
    kept: list[Candidate] = []
    while pending:
        current = pending.pop(0)
        kept.append(current)
        pending = [
            (s, e, c, score * decay if iou((s, e), current[:2]) >= iou_threshold else score) for s, e, c, score in pending
        ]
        pending.sort(key=lambda c: -c[3])
    return kept


def _conflicts(a: Candidate, b: Candidate, overlap: str) -> bool:
    if overlap == "flat":
        return a[0] < b[1] and b[0] < a[1]
    crossing = a[0] < b[0] < a[1] < b[1] or b[0] < a[0] < b[1] < a[1]
    return crossing


def decode_sentence(
    filter_prob: np.ndarray,
    spans: np.ndarray,
    class_probs: np.ndarray,
    seed_mask: np.ndarray,
    labels: tuple[str, ...],
    options: DecodeOptions,
) -> EntitySet:
    found = soft_nms(candidates(filter_prob, spans, class_probs, seed_mask, options), options.nms_decay, options.nms_iou)
    accepted: list[Candidate] = []
    for item in sorted(found, key=lambda c: -c[3]):
        if item[3] > options.threshold and not any(_conflicts(item, other, options.overlap) for other in accepted):
            accepted.append(item)
    return EntitySet(Entity(labels[c - 1], ((s, e),), score) for s, e, c, score in accepted)
