"""What GNER's step graph and loss need of a decoder (torch), whichever network it is (the
backbone reused as a decoder, or a T5 folder's own): cross-attention keys and values per layer
from the encoder's states, an empty cache, the states of new positions with the grown cache, and
output scores (of every token, or of a sampled vocabulary in training)."""

from __future__ import annotations

import torch
from torch import nn

Cache = list[torch.Tensor]  # [key, value] per layer, [rows, heads, positions, head_dim] each


class StepDecoder(nn.Module):
    layers: nn.ModuleList
    heads: int
    head_dim: int

    @property
    def vocabulary_size(self) -> int:
        raise NotImplementedError

    def cross(self, memory: torch.Tensor) -> Cache:
        raise NotImplementedError

    def states(
        self, cross: Cache, padding: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor, past: Cache
    ) -> tuple[torch.Tensor, Cache]:
        """tokens, positions [R, T] (cross and padding already per row) → states [R, T, D] and the grown cache."""
        raise NotImplementedError

    def scores(self, states: torch.Tensor, vocabulary: torch.Tensor | None = None) -> torch.Tensor:
        raise NotImplementedError

    def empty_cache(self, rows: int, device: torch.device) -> Cache:
        return [torch.zeros(rows, self.heads, 0, self.head_dim, device=device) for _ in range(2 * len(self.layers))]

    def logits(
        self, cross: Cache, padding: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor, past: Cache
    ) -> tuple[torch.Tensor, Cache]:
        """Scores of every token at the new positions [R, T, V], and the grown cache."""
        x, present = self.states(cross, padding, tokens, positions, past)
        return self.scores(x), present
