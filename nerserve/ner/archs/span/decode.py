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
    # every candidate of the batch at once, sentence by sentence (np.nonzero is row-major), as
    # Python numbers: one conversion per array, not one per value
    sentence, k = np.nonzero(keep)
    types = (classes[sentence, k] - 1).tolist()
    starts, ends = spans[sentence, k, 0].tolist(), spans[sentence, k, 1].tolist()
    kept_scores = scores[sentence, k].tolist()
    first = np.searchsorted(sentence, np.arange(len(options) + 1)).tolist()
    found: list[EntitySet] = []
    for b, chosen in enumerate(options):
        if first[b] == first[b + 1]:
            found.append(EntitySet())
            continue
        listed = (Entity(labels[types[i]], ((starts[i], ends[i]),), kept_scores[i]) for i in range(first[b], first[b + 1]))
        found.append(survivors(best_per(listed, key=lambda e: e.fragments), chosen))
    return found


def survivors(candidates_: list[Entity], options: DecodeOptions) -> EntitySet:
    """Soft-NMS, the threshold again (Soft-NMS lowers scores), then the overlap rule."""
    found = soft_nms(candidates_, options.nms_decay, options.nms_iou)
    return accept_best_first((c for c in found if c.score > options.threshold), options.overlap)


def soft_nms(items: list[Entity], decay: float, iou_threshold: float) -> list[Entity]:
    """Best first: every later proposal whose IoU with the one taken is ≥ the threshold has its score
    multiplied by `decay`, and the rest are re-sorted (stably). Scores and bounds are worked on as
    plain lists; an entity is rebuilt only where its score changed."""
    scores = [c.score for c in items]
    bounds = [(c.start, c.end) for c in items]
    pending = sorted(range(len(items)), key=lambda i: -scores[i])
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
                scores[i] *= decay
        pending.sort(key=lambda i: -scores[i])
    return [items[i] if scores[i] == items[i].score else replace(items[i], score=scores[i]) for i in kept]


def decode_sentence(
    filter_prob: np.ndarray,
    spans: np.ndarray,
    class_probs: np.ndarray,
    seed_mask: np.ndarray,
    labels: tuple[str, ...],
    options: DecodeOptions,
) -> EntitySet:
    return survivors(candidates(filter_prob, spans, class_probs, seed_mask, labels, options), options)
