"""Label-matching decoding in numpy: (span, label) pairs above the threshold → the best label of
each span → best-first acceptance, flat or nested (shared overlap rules)."""

from __future__ import annotations

import numpy as np

from nerserve.ner.archs.gliner.config import GlinerOptions
from nerserve.ner.decoding.overlap import accept_best_first
from nerserve.ner.types import Entity, EntitySet


def decode_sentence(
    scores: np.ndarray, spans: np.ndarray, span_mask: np.ndarray, labels: tuple[str, ...], options: GlinerOptions
) -> EntitySet:
    """One sentence: scores [S, L], spans [S, 2], span_mask [S]."""
    above = (scores > options.threshold) & span_mask[:, None]
    rows, columns = np.nonzero(above)
    found = [
        Entity(labels[int(c)], ((int(spans[r, 0]), int(spans[r, 1])),), float(scores[r, c]))
        for r, c in zip(rows.tolist(), columns.tolist(), strict=True)
    ]
    return accept_best_first(found, "nested" if options.nested else "flat", one_type_per_span=True)
