"""DiffusionNER's denoiser graph: one denoising step for K noisy spans per sentence.

Inputs word_states [B, N, D] (the shared encoder's output, computed once per sentence),
word_mask [B, N], noisy_spans [B, K, 2] (float32, noise space) and timestep [B] (int64) →
class_probs [B, K, C+1] (class 0 = no entity), left_probs / right_probs [B, K, N] (sigmoid
boundary pointers, 0 on padding). The sampling loop (DDIM, float64) runs outside the graph, so
K and the number of steps change per request without re-export.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from nerserve.ner.archs.diffusion.config import DiffusionConfig
from nerserve.ner.attention import multi_head_attention
from nerserve.ner.encoder import gather_positions

MASKED = -1e4  # fp16-safe "minus infinity" for boundary logits of padding words


def sinusoid(values: torch.Tensor, dim: int, dtype: torch.dtype) -> torch.Tensor:
    """[...] → [..., dim] sinusoidal embedding (timesteps, span indices), in DTYPE: the angles are
    taken in fp32 whatever the network's precision (a half-precision angle of a late timestep
    would be off by more than its sine's period)."""
    half = dim // 2
    frequencies = torch.exp(torch.arange(half, device=values.device, dtype=torch.float32) * (-math.log(10000.0) / (half - 1)))
    angles = values.to(torch.float32).unsqueeze(-1) * frequencies
    return torch.cat([angles.sin(), angles.cos()], dim=-1).to(dtype)


class SpanAttentionLayer(nn.Module):
    """Post-norm: self-attention among spans (position added to query and key), cross-attention
    to the words, feed-forward; as the paper's SpanAttentionLayer."""

    def __init__(self, dim: int, heads: int, ffn: int, dropout: float) -> None:
        super().__init__()
        self.self_attention = nn.MultiheadAttention(dim, heads, dropout=dropout, batch_first=True)
        self.cross_attention = nn.MultiheadAttention(dim, heads, dropout=dropout, batch_first=True)
        self.feed_forward = nn.Sequential(nn.Linear(dim, ffn), nn.ReLU(), nn.Dropout(dropout), nn.Linear(ffn, dim))
        self.norm_self = nn.LayerNorm(dim)
        self.norm_cross = nn.LayerNorm(dim)
        self.norm_ffn = nn.LayerNorm(dim)
        self.dropout = nn.Dropout(dropout)

    def forward(self, spans: torch.Tensor, position: torch.Tensor, words: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
        query = spans + position
        spans = self.norm_self(spans + self.dropout(self.attend(self.self_attention, query, query, spans, None)))
        attended = self.attend(self.cross_attention, spans + position, words, words, padding)
        spans = self.norm_cross(spans + self.dropout(attended))
        return self.norm_ffn(spans + self.dropout(self.feed_forward(spans)))

    def attend(
        self,
        module: nn.MultiheadAttention,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        padding: torch.Tensor | None,
    ) -> torch.Tensor:
        if self.training:  # torch's module, with its attention dropout
            return module(query, key, value, key_padding_mask=padding, need_weights=False)[0]
        return multi_head_attention(module, query, key, value, padding)  # traceable (ner/attention.py)


class BoundaryPointer(nn.Module):
    """relu(W_word·h_word + W_span·h_span) → one logit per (span, word)."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.word = nn.Linear(dim, hidden)
        self.span = nn.Linear(dim, hidden)
        self.out = nn.Linear(hidden, 1)

    def forward(self, words: torch.Tensor, spans: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
        hidden = torch.relu(self.word(words).unsqueeze(1) + self.span(spans).unsqueeze(2))  # [B, K, N, D]
        return self.out(hidden).squeeze(-1).masked_fill(padding.unsqueeze(1), MASKED)


class DenoiserGraph(nn.Module):
    def __init__(self, word_size: int, config: DiffusionConfig) -> None:
        super().__init__()
        dim = word_size
        self.dim = dim
        self.scale = config.scale
        self.pooling = config.span_pooling
        self.affine_start = nn.Linear(dim, dim)
        self.affine_end = nn.Linear(dim, dim)
        self.down = nn.Linear(2 * dim, dim)
        self.dropout = nn.Dropout(config.dropout)
        self.position = nn.Sequential(nn.Linear(dim, dim), nn.GELU(), nn.Linear(dim, dim))
        self.time = nn.Sequential(nn.Linear(dim, dim), nn.GELU(), nn.Linear(dim, dim))
        self.layers = nn.ModuleList(
            SpanAttentionLayer(dim, config.span_heads, config.span_ffn, config.dropout) for _ in range(config.span_layers)
        )
        self.left = BoundaryPointer(dim, config.pointer_dim)
        self.right = BoundaryPointer(dim, config.pointer_dim)
        self.classifier = nn.Sequential(nn.Linear(dim, dim), nn.GELU(), nn.Linear(dim, len(config.labels) + 1))

    def span_words(self, noisy_spans: torch.Tensor, word_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Noise (left, width) → integer word boundaries [B, K] each, inside each sentence."""
        last = (word_mask.sum(dim=1) - 1).clamp(min=0)  # [B] float
        unit = (noisy_spans.clamp(-self.scale, self.scale) / self.scale + 1.0) / 2.0
        left = unit[..., 0]
        right = (unit[..., 0] + unit[..., 1]).clamp(0.0, 1.0)
        bound = last.unsqueeze(1)
        left_word = torch.minimum(torch.round(left * bound), bound).to(torch.int64)
        right_word = torch.minimum(torch.round(right * bound), bound).to(torch.int64)
        return left_word, right_word

    def represent(self, words: torch.Tensor, left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
        if self.pooling == "mean":
            steps = torch.arange(words.shape[1], device=words.device).view(1, 1, -1)
            inside = ((steps >= left.unsqueeze(-1)) & (steps <= right.unsqueeze(-1))).to(words.dtype)  # [B, K, N]
            return torch.bmm(inside, words) / inside.sum(-1, keepdim=True).clamp(min=1.0)
        start = gather_positions(words, left)
        end = gather_positions(words, right)
        start = self.dropout(self.affine_start(start))
        end = self.dropout(self.affine_end(end))
        return self.down(torch.cat([start, end], dim=-1))

    def logits(
        self, word_states: torch.Tensor, word_mask: torch.Tensor, noisy_spans: torch.Tensor, timestep: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Class logits [B, K, C+1], left and right boundary logits [B, K, N]."""
        padding = word_mask < 0.5
        left, right = self.span_words(noisy_spans, word_mask)
        spans = self.represent(word_states, left, right)
        proposals = torch.arange(noisy_spans.shape[1], device=noisy_spans.device)
        position = self.position(sinusoid(proposals, self.dim, word_states.dtype)).unsqueeze(0)
        for layer in self.layers:
            spans = layer(spans, position, word_states, padding)
        spans = spans + self.time(sinusoid(timestep, self.dim, word_states.dtype)).unsqueeze(1)
        return self.classifier(spans), self.left(word_states, spans, padding), self.right(word_states, spans, padding)

    def forward(
        self, word_states: torch.Tensor, word_mask: torch.Tensor, noisy_spans: torch.Tensor, timestep: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        classes, left, right = self.logits(word_states, word_mask, noisy_spans, timestep)
        return torch.softmax(classes, dim=-1), torch.sigmoid(left), torch.sigmoid(right)
