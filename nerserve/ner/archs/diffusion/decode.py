"""DiffusionNER post-processing in numpy (the official evaluator's rules, paper's duplicate rule).

Per proposal: type = argmax of the class probabilities, left/right = argmax of the boundary
probabilities over the sentence's words; score = mean of the three maxima. Keep a proposal when
its type is an entity, left ≤ right and score > threshold; then, best first, drop a span already
taken (the paper keeps the most probable of identical boundaries) and apply the overlap rule
(flat: no shared word; nested: no crossing spans). The tests run once over every proposal of a
batch, and a span that overlaps no other is taken at once (the best of its proposals); an Entity
is made only for what is accepted.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from nerserve.ner.archs.diffusion.config import DiffusionDecodeOptions
from nerserve.ner.decoding.overlap import accept_spans_best_first, lone_entities, lone_spans, spans_by_sentence
from nerserve.ner.types import Entity, EntitySet


def argmax_within(probs: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Per row of probabilities [P, N], the first maximum among its first `lengths` columns: a
    boundary is a word of the proposal's own sentence, never the batch's padding. The argmax over
    the whole row is that one wherever it falls inside; only the other rows are searched again."""
    best = probs.argmax(axis=-1)
    outside = np.flatnonzero(best >= lengths)
    if len(outside):
        beyond = np.arange(probs.shape[1])[None, :] >= lengths[outside][:, None]
        best[outside] = np.where(beyond, -1.0, probs[outside]).argmax(axis=-1)  # -1 loses to every probability
    return best


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
    words = np.asarray(lengths, dtype=np.int64)[owner]
    left, right = argmax_within(left_probs, words), argmax_within(right_probs, words)
    classes = class_probs.argmax(axis=-1)
    scores = (class_probs[rows, classes] + left_probs[rows, left] + right_probs[rows, right]) / 3.0
    thresholds = np.array([o.threshold for o in options], dtype=scores.dtype)
    kept = np.flatnonzero((classes > 0) & (left <= right) & (scores > thresholds[owner]))
    kept = kept[np.argsort(owner[kept], kind="stable")]  # sentence by sentence, each in proposal order
    sentence, classes, scores, starts, ends = owner[kept], classes[kept], scores[kept], left[kept], right[kept] + 1
    # proposals converge: most spans are proposed several times, and overlap no other span
    alone, settled = lone_spans(sentence, starts, ends, scores, np.ones(len(options), dtype=bool))
    found = lone_entities(alone, sentence, starts, ends, classes, scores, labels, len(options))
    rest = ~settled
    types, kept_scores = (classes[rest] - 1).tolist(), scores[rest].tolist()
    for b, lo, bounds in spans_by_sentence(sentence[rest], starts[rest].tolist(), ends[rest].tolist()):
        own_scores = kept_scores[lo : lo + len(bounds)]
        accepted = accept_spans_best_first(bounds, own_scores, options[b].overlap, one_type_per_span=True)
        found[b].extend(Entity(labels[types[lo + i]], (bounds[i],), kept_scores[lo + i]) for i in accepted)
    return [EntitySet(entities) for entities in found]
