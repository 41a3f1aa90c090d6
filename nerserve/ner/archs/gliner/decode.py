"""Label-matching decoding in numpy: (span, label) pairs above the threshold → the best label of
each span → best-first acceptance, flat or nested (shared overlap rules). The pairs are found for
the whole batch at once, and an Entity is made only for what the overlap rule accepts."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from nerserve.ner.archs.gliner.config import GlinerOptions
from nerserve.ner.decoding.overlap import Overlap, accept_spans_best_first, spans_by_sentence
from nerserve.ner.types import Entity, EntitySet


def decode_batch(
    scores: np.ndarray,
    spans: np.ndarray,
    span_mask: np.ndarray,
    labels: Sequence[tuple[str, ...]],
    options: Sequence[GlinerOptions],
) -> list[EntitySet]:
    """scores [B, S, L] (a sentence's columns past its own labels are ignored), spans [B, S, 2],
    span_mask [B, S]; each sentence's label names and options."""
    thresholds = np.array([o.threshold for o in options], dtype=scores.dtype)[:, None, None]
    # the threshold over [B, S, L] first, flat, then the masks only on the pairs above it (a span
    # not scored has the bias's score, which a low threshold passes; masking the whole tensor
    # first costs more than the test); flat order is sentence by sentence, span by span, label
    # by label
    flat = np.flatnonzero(scores > thresholds)
    flat = flat[span_mask.ravel()[flat // scores.shape[2]]]
    sentence, span, label = np.unravel_index(flat, scores.shape)
    asked = label < np.array([len(names) for names in labels])[sentence]
    sentence, span, label = sentence[asked], span[asked], label[asked]
    pair_scores, label_ids = scores[sentence, span, label].tolist(), label.tolist()
    starts, ends = spans[sentence, span, 0].tolist(), spans[sentence, span, 1].tolist()
    found = [EntitySet() for _ in options]
    for b, lo, bounds in spans_by_sentence(sentence, starts, ends):
        overlap: Overlap = "nested" if options[b].nested else "flat"
        accepted = accept_spans_best_first(bounds, pair_scores[lo : lo + len(bounds)], overlap, one_type_per_span=True)
        found[b] = EntitySet(Entity(labels[b][label_ids[lo + i]], (bounds[i],), pair_scores[lo + i]) for i in accepted)
    return found
