"""Span decoding in numpy: filter mask → typed candidates → dedup → Soft-NMS → threshold → overlap rule.

Soft-NMS follows the paper's Algorithm 1 (decay the score of every later proposal whose IoU with
the current one is ≥ k by u, keep the list sorted), not the official code's reordering quirk.
Soft-NMS only lowers scores, so candidates at or below δ are dropped before it: exact, and cheap.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from nerserve.ner.archs.span.config import DecodeOptions
from nerserve.ner.decoding.overlap import accept_best_first, best_per
from nerserve.ner.types import Entity, EntitySet


def iou(a: Entity, b: Entity) -> float:
    inter = min(a.end, b.end) - max(a.start, b.start)
    if inter <= 0:
        return 0.0
    return inter / ((a.end - a.start) + (b.end - b.start) - inter)


def candidates(
    filter_prob: np.ndarray,
    spans: np.ndarray,
    class_probs: np.ndarray,
    seed_mask: np.ndarray,
    labels: tuple[str, ...],
    options: DecodeOptions,
) -> list[Entity]:
    """One sentence: [K], [K, 2], [K, C+1], [K] → candidates above δ, the best type of each span."""
    classes = class_probs.argmax(axis=-1)
    scores = class_probs.max(axis=-1)
    keep = (seed_mask > 0) & (filter_prob > options.filter_threshold) & (classes > 0) & (scores > options.threshold)
    found = (
        Entity(labels[int(classes[k]) - 1], ((int(spans[k, 0]), int(spans[k, 1])),), float(scores[k]))
        for k in np.flatnonzero(keep)
    )
    return best_per(found, key=lambda e: e.fragments)


def decode_batch(
    filter_prob: np.ndarray,
    spans: np.ndarray,
    class_probs: np.ndarray,
    seed_mask: np.ndarray,
    labels: tuple[str, ...],
    options: list[DecodeOptions],
) -> list[EntitySet]:
    """decode_sentence for every sentence of a batch ([B, K], [B, K, 2], [B, K, C+1], [B, K]): the
    candidate tests run once over the batch, the rest only for sentences that have candidates."""
    classes = class_probs.argmax(axis=-1)
    scores = np.take_along_axis(class_probs, classes[..., None], axis=-1)[..., 0]
    thresholds = np.array([o.threshold for o in options], dtype=scores.dtype)[:, None]
    filters = np.array([o.filter_threshold for o in options], dtype=filter_prob.dtype)[:, None]
    keep = (seed_mask > 0) & (filter_prob > filters) & (classes > 0) & (scores > thresholds)
    found: list[EntitySet] = []
    for b, chosen in enumerate(options):
        rows = np.flatnonzero(keep[b])
        if not len(rows):
            found.append(EntitySet())
            continue
        listed = (
            Entity(labels[int(classes[b, k]) - 1], ((int(spans[b, k, 0]), int(spans[b, k, 1])),), float(scores[b, k]))
            for k in rows
        )
        found.append(survivors(best_per(listed, key=lambda e: e.fragments), chosen))
    return found


def survivors(candidates_: list[Entity], options: DecodeOptions) -> EntitySet:
    """Soft-NMS, the threshold again (Soft-NMS lowers scores), then the overlap rule."""
    found = soft_nms(candidates_, options.nms_decay, options.nms_iou)
    return accept_best_first((c for c in found if c.score > options.threshold), options.overlap)


def soft_nms(items: list[Entity], decay: float, iou_threshold: float) -> list[Entity]:
    pending = sorted(items, key=lambda c: -c.score)
    kept: list[Entity] = []
    while pending:
        current = pending.pop(0)
        kept.append(current)
        pending = [replace(c, score=c.score * decay) if iou(c, current) >= iou_threshold else c for c in pending]
        pending.sort(key=lambda c: -c.score)
    return kept


def decode_sentence(
    filter_prob: np.ndarray,
    spans: np.ndarray,
    class_probs: np.ndarray,
    seed_mask: np.ndarray,
    labels: tuple[str, ...],
    options: DecodeOptions,
) -> EntitySet:
    return survivors(candidates(filter_prob, spans, class_probs, seed_mask, labels, options), options)
