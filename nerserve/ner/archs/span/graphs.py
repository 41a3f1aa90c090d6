"""The span-proposal graph: all seed spans → filter probability, boundary offsets, adjusted spans,
class probabilities of the adjusted spans. Gathers only: no Python loops over batch or spans.

Two choices keep it cheap enough for CPU training and serving, without changing what the paper's
heads see ([max-pool of the span; left boundary word; right boundary word; context] → MLP):

- the MLPs' first linear layer is applied per *word* and per sentence, then gathered per span
  (a linear map of a concatenation is the sum of the maps of its parts). The pooled part is the
  max over the span of linearly projected word vectors (max-pool of learned features) rather than
  the projection of the max-pool: K spans cost gathers, not K matrix products of width 4·D;
- span max-pooling uses a sparse table (range-maximum query): level j holds the max over
  [i, i + 2^j), so any span [s, e) is max(level_j[s], level_j[e - 2^j]) with j = ⌊log2(e - s)⌋.
  Exact, O(N log N) memory instead of the O(K·N) masks of the official code, and valid for
  adjusted spans of any length.
"""

from __future__ import annotations

import torch
from torch import nn

from nerserve.ner.encoder import gather_positions

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


def range_max(table: torch.Tensor, n: int, starts: torch.Tensor, ends: torch.Tensor, levels: int) -> torch.Tensor:
    """Max-pool of spans [starts, ends) (ends > starts), [B, K] each → [B, K, D]."""
    lengths = ends - starts
    powers = 2 ** torch.arange(1, levels, device=starts.device)
    level = (lengths.unsqueeze(-1) >= powers).sum(-1)  # ⌊log2(length)⌋, capped at levels - 1
    width = torch.pow(2, level)
    first = gather_words(table, level * n + starts)
    second = gather_words(table, level * n + ends - width)
    return torch.maximum(first, second)


def gather_words(states: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """states [B, N, D], index [B, K] → [B, K, D]."""
    return gather_positions(states, index)


class SpanScorer(nn.Module):
    """MLP([max-pool; left word; right word; context]) → outputs, factorised per word (see above)."""

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
        n = states.shape[1]
        starts, ends = spans[..., 0], spans[..., 1]
        if self.outer:
            left, right = torch.clamp(starts - 1, min=0), torch.clamp(ends, max=n - 1)
        else:
            left, right = starts, ends - 1
        table = range_max_table(self.pool(states), word_mask, self.levels)
        hidden = (
            range_max(table, n, starts, ends, self.levels)
            + gather_words(self.left(states), left)
            + gather_words(self.right(states), right)
            + self.context(context).unsqueeze(1)
        )
        return self.out(self.activation(hidden))


class SpanProposalGraph(nn.Module):
    def __init__(self, word_size: int, context_size: int, n_classes: int, hidden: int, dropout: float, levels: int) -> None:
        super().__init__()
        self.filter = SpanScorer(word_size, context_size, hidden, 2, levels, outer=False)
        self.regressor = SpanScorer(word_size, context_size, hidden, 2, levels, outer=True)
        self.classifier = SpanScorer(word_size, context_size, hidden, n_classes + 1, levels, outer=False)  # 0 = none
        self.dropout = nn.Dropout(dropout)

    def regularise(self, states: torch.Tensor, context: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Dropout on the word and context vectors, before spans are built from them."""
        return self.dropout(states), self.dropout(context)

    @staticmethod
    def adjust(seeds: torch.Tensor, offsets: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """seed + round(offset), clipped to the sentence; a span left empty reverts to its seed."""
        moved = seeds + torch.round(offsets).to(seeds.dtype)
        n = lengths.unsqueeze(1)
        starts = torch.minimum(torch.clamp(moved[..., 0], min=0), n - 1)
        ends = torch.maximum(torch.minimum(moved[..., 1], n), torch.ones_like(n))
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
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        word_states, context = self.regularise(word_states, context)
        filter_logits = self.filter(word_states, context, word_mask, seeds)
        offsets = self.regressor(word_states, context, word_mask, seeds)
        lengths = word_mask.sum(dim=1).to(seeds.dtype)
        spans = self.adjust(seeds, offsets, lengths)
        class_probs = torch.softmax(self.classifier(word_states, context, word_mask, spans), dim=-1)
        filter_prob = torch.softmax(filter_logits, dim=-1)[..., 1] * seed_mask
        return filter_prob, offsets, spans, class_probs
