"""DiffusionNER post-processing in numpy (the official evaluator's rules, paper's duplicate rule).

Per proposal: type = argmax of the class probabilities, left/right = argmax of the boundary
probabilities over the sentence's words; score = mean of the three maxima. Keep a proposal when
its type is an entity, left ≤ right and score > threshold; then, best first, drop a span already
taken (the paper keeps the most probable of identical boundaries) and apply the overlap rule
(flat: no shared word; nested: no crossing spans).
"""

from __future__ import annotations

import numpy as np

from ner.archs.diffusion.config import DiffusionDecodeOptions
from ner.types import Entity, EntitySet

Candidate = tuple[int, int, int, float]  # start, end (excluded), class index, score


def proposal_boundaries(left_probs: np.ndarray, right_probs: np.ndarray, length: int) -> tuple[np.ndarray, np.ndarray]:
    """Most probable left and right word ([K] each) of each proposal within the sentence's words."""
    return left_probs[:, :length].argmax(axis=-1), right_probs[:, :length].argmax(axis=-1)


def _conflicts(a: Candidate, b: Candidate, overlap: str) -> bool:
    if overlap == "flat":
        return a[0] < b[1] and b[0] < a[1]
    return a[0] < b[0] < a[1] < b[1] or b[0] < a[0] < b[1] < a[1]


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
    found: list[Candidate] = sorted(
        ((int(left[k]), int(right[k]) + 1, int(classes[k]), float(scores[k])) for k in keep), key=lambda c: -c[3]
    )
    accepted: list[Candidate] = []
    taken: set[tuple[int, int]] = set()
    for item in found:
        if item[:2] in taken or any(_conflicts(item, other, options.overlap) for other in accepted):
            continue
        taken.add(item[:2])
        accepted.append(item)
    return EntitySet(Entity(labels[c - 1], ((s, e),), score) for s, e, c, score in accepted)
