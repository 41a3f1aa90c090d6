"""DiffusionNER post-processing in numpy (the official evaluator's rules, paper's duplicate rule).

Per proposal: type = argmax of the class probabilities, left/right = argmax of the boundary
probabilities over the sentence's words; score = mean of the three maxima. Keep a proposal when
its type is an entity, left ≤ right and score > threshold; then, best first, drop a span already
taken (the paper keeps the most probable of identical boundaries) and apply the overlap rule
(flat: no shared word; nested: no crossing spans). The tests run once over every proposal of a
batch; an Entity is made only for what the overlap rule accepts.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from nerserve.ner.archs.diffusion.config import DiffusionDecodeOptions
from nerserve.ner.decoding.overlap import accept_spans_best_first, spans_by_sentence
from nerserve.ner.types import Entity, EntitySet


def decode_batch(
    class_probs: np.ndarray,
    left_probs: np.ndarray,
    right_probs: np.ndarray,
    owner: np.ndarray,
    lengths: Sequence[int],
    labels: tuple[str, ...],
    options: Sequence[DiffusionDecodeOptions],
) -> list[EntitySet]:
    """Every proposal of a batch, in any order of sentences: [P, C+1], [P, N], [P, N], and the
    sentence of each [P] → each sentence's entity set."""
    rows = np.arange(len(owner))
    # a boundary is a word of the proposal's own sentence: the batch's padding words never win
    # (probabilities are ≥ 0, so -1 loses every argmax, and the first maximum stays the first)
    beyond = np.arange(left_probs.shape[1])[None, :] >= np.asarray(lengths, dtype=np.int64)[owner][:, None]
    left = np.where(beyond, -1.0, left_probs).argmax(axis=-1)
    right = np.where(beyond, -1.0, right_probs).argmax(axis=-1)
    classes = class_probs.argmax(axis=-1)
    scores = (class_probs[rows, classes] + left_probs[rows, left] + right_probs[rows, right]) / 3.0
    thresholds = np.array([o.threshold for o in options], dtype=scores.dtype)
    kept = np.flatnonzero((classes > 0) & (left <= right) & (scores > thresholds[owner]))
    kept = kept[np.argsort(owner[kept], kind="stable")]  # sentence by sentence, each in proposal order
    types, kept_scores = (classes[kept] - 1).tolist(), scores[kept].tolist()
    starts, ends = left[kept].tolist(), (right[kept] + 1).tolist()
    found: list[EntitySet] = []
    for (lo, bounds), chosen in zip(spans_by_sentence(owner[kept], starts, ends, len(options)), options, strict=True):
        accepted = accept_spans_best_first(bounds, kept_scores[lo : lo + len(bounds)], chosen.overlap, one_type_per_span=True)
        found.append(EntitySet(Entity(labels[types[lo + i]], (bounds[i],), kept_scores[lo + i]) for i in accepted))
    return found
