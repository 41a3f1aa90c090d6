"""DiffusionNER post-processing in numpy (the official evaluator's rules, paper's duplicate rule).

Per proposal: type = argmax of the class probabilities, left/right = argmax of the boundary
probabilities over the sentence's words; score = mean of the three maxima. Keep a proposal when
its type is an entity, left ≤ right and score > threshold; then, best first, drop a span already
taken (the paper keeps the most probable of identical boundaries) and apply the overlap rule
(flat: no shared word; nested: no crossing spans).
"""

from __future__ import annotations

import numpy as np

from nerserve.ner.archs.diffusion.config import DiffusionDecodeOptions
from nerserve.ner.decoding.overlap import accept_best_first
from nerserve.ner.types import Entity, EntitySet


def proposal_boundaries(left_probs: np.ndarray, right_probs: np.ndarray, length: int) -> tuple[np.ndarray, np.ndarray]:
    """Most probable left and right word ([K] each) of each proposal within the sentence's words."""
    return left_probs[:, :length].argmax(axis=-1), right_probs[:, :length].argmax(axis=-1)


def decode_sentence(
    class_probs: np.ndarray,
    left_probs: np.ndarray,
    right_probs: np.ndarray,
    length: int,
    labels: tuple[str, ...],
    options: DiffusionDecodeOptions,
) -> EntitySet:
    """One sentence's proposals: [K, C+1], [K, N], [K, N] → its entity set."""
    left, right = proposal_boundaries(left_probs, right_probs, length)
    rows = np.arange(len(left))
    classes = class_probs.argmax(axis=-1)
    scores = (class_probs.max(axis=-1) + left_probs[rows, left] + right_probs[rows, right]) / 3.0
    keep = np.flatnonzero((classes > 0) & (left <= right) & (scores > options.threshold))
    found = (Entity(labels[int(classes[k]) - 1], ((int(left[k]), int(right[k]) + 1),), float(scores[k])) for k in keep)
    return accept_best_first(found, options.overlap, one_type_per_span=True)
