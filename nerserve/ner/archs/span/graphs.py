"""The span-proposal graph: all seed spans → the candidates the filter passes, their adjusted spans
and class probabilities. Gathers only: no Python loops over batch or spans.

Three choices keep it cheap enough for CPU training and serving, without changing what the paper's
heads see ([max-pool of the span; left boundary word; right boundary word; context] → MLP):

- the MLPs' first linear layer is applied per *word* and per sentence, then gathered per span
  (a linear map of a concatenation is the sum of the maps of its parts). The pooled part is the
  max over the span of linearly projected word vectors (max-pool of learned features) rather than
  the projection of the max-pool: K spans cost gathers, not K matrix products of width 4·D;
- span max-pooling uses a sparse table (range-maximum query): level j holds the max over
  [i, i + 2^j), so any span [s, e) is max(level_j[s], level_j[e - 2^j]) with j = ⌊log2(e - s)⌋.
  Exact, O(N log N) memory instead of the O(K·N) masks of the official code, and valid for
  adjusted spans of any length (the seeds' scorers build only the levels seeds need);
- only the seeds the filter passes (a few percent) are adjusted and classified, and only they
  leave the graph, since decoding reads nothing else: the regressor's and classifier's span work
  shrinks by as much, and a device copies the host the candidates, not [B, K] tensors.
"""

from __future__ import annotations

import torch
from torch import nn

_PAD_VALUE = -1e4  # far below any projected word feature; representable in fp16 too


def range_max_table(states: torch.Tensor, word_mask: torch.Tensor, levels: int) -> torch.Tensor:
    """[B, N, D] → [B, levels·N, D]: level j, position i = max of states[i : i + 2^j]."""
    level = states.masked_fill(word_mask.unsqueeze(-1) == 0, _PAD_VALUE)
    n = states.shape[1]
    positions = torch.arange(n, device=states.device)
    tables = [level]
    for j in range(levels - 1):
        shifted = torch.clamp(positions + (1 << j), max=n - 1)
        level = torch.maximum(level, level.index_select(1, shifted))
        tables.append(level)
    return torch.cat(tables, dim=1)


def range_max(
    table: torch.Tensor, n: int, sentence: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor, levels: int
) -> torch.Tensor:
    """Max-pool of spans [starts, ends) (ends > starts) of sentences `sentence`, [M] each → [M, D]."""
    lengths = ends - starts
    powers = 2 ** torch.arange(1, levels, device=starts.device)
    level = (lengths.unsqueeze(-1) >= powers).sum(-1)  # ⌊log2(length)⌋, capped at levels - 1
    width = torch.pow(2, level)
    base = sentence * (levels * n) + level * n
    return torch.maximum(word_rows(table, base + starts), word_rows(table, base + ends - width))


def word_rows(states: torch.Tensor, flat_index: torch.Tensor) -> torch.Tensor:
    """states [B, N, D], flat_index [M] (sentence · N + position) → [M, D]: one index_select."""
    return states.reshape(-1, states.shape[-1]).index_select(0, flat_index)


def every_span(spans: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, K, 2] → each span's sentence [B·K] and the spans [B·K, 2]."""
    batch, k = spans.shape[:2]
    sentence = torch.arange(batch, device=spans.device).unsqueeze(1).expand(batch, k).reshape(-1)
    return sentence, spans.reshape(-1, 2)


class SpanScorer(nn.Module):
    """MLP([max-pool; left word; right word; context]) → outputs, factorised per word (see above).
    LEVELS: the range-max table's, enough for the longest span it is asked to pool."""

    def __init__(self, word_size: int, context_size: int, hidden: int, outputs: int, levels: int, outer: bool) -> None:
        super().__init__()
        self.pool = nn.Linear(word_size, hidden)
        self.left = nn.Linear(word_size, hidden, bias=False)
        self.right = nn.Linear(word_size, hidden, bias=False)
        self.context = nn.Linear(context_size, hidden, bias=False)
        self.activation = nn.GELU()
        self.out = nn.Linear(hidden, outputs)
        self.levels = levels
        self.outer = outer  # boundary words just outside the span (regressor) or inside it

    def forward(
        self, states: torch.Tensor, context: torch.Tensor, word_mask: torch.Tensor, spans: torch.Tensor
    ) -> torch.Tensor:
        """Every span of every sentence, [B, K, 2] → [B, K, outputs]."""
        batch, k = spans.shape[:2]
        words = self._span_words(states, word_mask, *every_span(spans)).reshape(batch, k, -1)
        return self.out(self.activation(words + self.context(context).unsqueeze(1)))

    def score_rows(
        self, states: torch.Tensor, context: torch.Tensor, word_mask: torch.Tensor, sentence: torch.Tensor, spans: torch.Tensor
    ) -> torch.Tensor:
        """Chosen spans only: span m, [M, 2], of sentence `sentence[m]` → [M, outputs]."""
        words = self._span_words(states, word_mask, sentence, spans)
        return self.out(self.activation(words + self.context(context).index_select(0, sentence)))

    def _span_words(
        self, states: torch.Tensor, word_mask: torch.Tensor, sentence: torch.Tensor, spans: torch.Tensor
    ) -> torch.Tensor:
        """The first layer's part from the span's words (pool, left, right): [M, hidden]."""
        n = states.shape[1]
        starts, ends = spans[:, 0], spans[:, 1]
        if self.outer:
            left, right = torch.clamp(starts - 1, min=0), torch.clamp(ends, max=n - 1)
        else:
            left, right = starts, ends - 1
        table = range_max_table(self.pool(states), word_mask, self.levels)
        base = sentence * n
        return (
            range_max(table, n, sentence, starts, ends, self.levels)
            + word_rows(self.left(states), base + left)
            + word_rows(self.right(states), base + right)
        )


class SpanProposalGraph(nn.Module):
    """The filter scores every seed; the regressor and the classifier read only the seeds decoding
    will (those the filter passes at each sentence's `filter_threshold`: a few percent), and only
    those candidates come out: (sentence, seed) of each, its adjusted span, its class
    probabilities, sentence by sentence in seed order. Without thresholds (tests) every seed is a
    candidate. Training calls the scorers itself (`span/loss.py`)."""

    def __init__(
        self, word_size: int, context_size: int, n_classes: int, hidden: int, dropout: float, levels: int, max_width: int
    ) -> None:
        super().__init__()
        seed_levels = min(levels, max_width.bit_length())  # seeds are at most max_width words: exact
        self.filter = SpanScorer(word_size, context_size, hidden, 2, seed_levels, outer=False)
        self.regressor = SpanScorer(word_size, context_size, hidden, 2, seed_levels, outer=True)
        # adjusted spans may be longer than any seed
        self.classifier = SpanScorer(word_size, context_size, hidden, n_classes + 1, levels, outer=False)  # 0 = none
        self.dropout = nn.Dropout(dropout)

    def regularise(self, states: torch.Tensor, context: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Dropout on the word and context vectors, before spans are built from them."""
        return self.dropout(states), self.dropout(context)

    @staticmethod
    def adjust(seeds: torch.Tensor, offsets: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """seed + round(offset), clipped to the sentence; a span left empty reverts to its seed.
        `lengths`: each seed's sentence length, in the shape of `seeds[..., 0]` or broadcast to it."""
        moved = seeds + torch.round(offsets).to(seeds.dtype)
        starts = torch.minimum(torch.clamp(moved[..., 0], min=0), lengths - 1)
        ends = torch.maximum(torch.minimum(moved[..., 1], lengths), torch.ones_like(lengths))
        legal = starts < ends
        starts = torch.where(legal, starts, seeds[..., 0])
        ends = torch.where(legal, ends, seeds[..., 1])
        return torch.stack([starts, ends], dim=-1)

    def forward(
        self,
        word_states: torch.Tensor,
        context: torch.Tensor,
        word_mask: torch.Tensor,
        seeds: torch.Tensor,
        seed_mask: torch.Tensor,
        filter_threshold: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        word_states, context = self.regularise(word_states, context)
        filter_logits = self.filter(word_states, context, word_mask, seeds)
        chosen = seed_mask > 0
        if filter_threshold is not None:
            filter_prob = torch.softmax(filter_logits, dim=-1)[..., 1]
            chosen = chosen & (filter_prob > filter_threshold.unsqueeze(1))
        candidates = torch.nonzero(chosen)  # [M, 2]: row-major, so sentence by sentence
        sentence = candidates[:, 0]
        picked = seeds.reshape(-1, 2).index_select(0, sentence * seeds.shape[1] + candidates[:, 1])
        offsets = self.regressor.score_rows(word_states, context, word_mask, sentence, picked)
        lengths = word_mask.sum(dim=1).to(seeds.dtype).index_select(0, sentence)
        spans = self.adjust(picked, offsets, lengths)
        class_probs = torch.softmax(self.classifier.score_rows(word_states, context, word_mask, sentence, spans), dim=-1)
        return candidates, spans, class_probs
