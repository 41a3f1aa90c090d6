"""The pointer decoder (torch): pre-norm transformer decoder layers with an explicit key/value
cache, trained on whole sequences (causal) and exported as one step.

Inputs of a row (one sequence): the sentence it belongs to (`row_sentence`), its previous token
and that token's position. A pointer token is embedded as the pointed word's memory vector, the
other tokens by a learned table. Scores: a linear map for end / markers / types, and a scaled dot
product between the decoder state and each word's pointer key for the pointers.

What a step reads of its sentence is computed once per sentence (the memory, the pointer keys,
each layer's cross-attention keys and values) and selected per row: recomputed at every step, the
cross-attention keys and values were most of a step's arithmetic (2·N·D² a row and layer, against
about 11·D² for all the rest).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from nerserve.ner.archs.pointer.config import PointerConfig
from nerserve.ner.archs.pointer.vocabulary import SPECIALS
from nerserve.ner.attention import later_positions
from nerserve.ner.torch_graph import as_steps

MASKED = -1e4  # fp16-safe "minus infinity" for pointers to padding words


class CachedDecoderLayer(nn.Module):
    """Self-attention over the cache + the new positions (causal), cross-attention to the words,
    feed-forward; returns the keys and values of every position so far (the next cache)."""

    def __init__(self, dim: int, heads: int, ffn: int, dropout: float) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.norm_self, self.norm_cross, self.norm_ffn = nn.LayerNorm(dim), nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.self_out = nn.Linear(dim, dim)
        self.cross_q = nn.Linear(dim, dim)
        self.cross_kv = nn.Linear(dim, 2 * dim)
        self.cross_out = nn.Linear(dim, dim)
        self.ffn = nn.Sequential(nn.Linear(dim, ffn), nn.GELU(), nn.Dropout(dropout), nn.Linear(ffn, dim))
        self.dropout = nn.Dropout(dropout)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(x.shape[0], x.shape[1], self.heads, self.head_dim).transpose(1, 2)

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, blocked: torch.Tensor) -> torch.Tensor:
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(self.head_dim)
        weights = torch.softmax(scores.masked_fill(blocked, MASKED), dim=-1)
        out = weights @ v  # [R, H, T, hd]
        return out.transpose(1, 2).reshape(out.shape[0], out.shape[2], -1)

    def cross_keys_values(self, memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[B, N, D] memory → this layer's cross-attention keys and values [B, H, N, hd]."""
        ck, cv = self.cross_kv(memory).chunk(2, dim=-1)
        return self._split(ck), self._split(cv)

    def forward(
        self,
        x: torch.Tensor,
        cross_key: torch.Tensor,
        cross_value: torch.Tensor,
        padding: torch.Tensor,
        past_key: torch.Tensor,
        past_value: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q, k, v = self.qkv(self.norm_self(x)).chunk(3, dim=-1)
        keys = torch.cat([past_key, self._split(k)], dim=2)
        values = torch.cat([past_value, self._split(v)], dim=2)
        past, new = past_key.shape[2], x.shape[1]
        later = later_positions(past, new, x.device)
        x = x + self.dropout(self.self_out(self._attend(self._split(q), keys, values, later)))
        blocked = padding.unsqueeze(1).unsqueeze(1)  # [R, 1, 1, N]
        crossed = self._attend(self._split(self.cross_q(self.norm_cross(x))), cross_key, cross_value, blocked)
        x = x + self.dropout(self.cross_out(crossed))
        x = x + self.dropout(self.ffn(self.norm_ffn(x)))
        return x, keys, values


class PointerDecoder(nn.Module):
    def __init__(
        self, word_size: int, labels: int, dim: int, layers: int, heads: int, ffn: int, dropout: float, max_positions: int
    ) -> None:
        super().__init__()
        self.first_pointer = len(SPECIALS) + labels
        self.heads, self.head_dim, self.max_positions = heads, dim // heads, max_positions
        self.memory_projection = nn.Sequential(nn.Linear(word_size, dim), nn.LayerNorm(dim))
        self.pointer_key = nn.Linear(dim, dim)
        self.pointer_query = nn.Linear(dim, dim)
        self.tokens = nn.Embedding(self.first_pointer, dim)
        self.word_input = nn.Linear(dim, dim)
        self.position = nn.Embedding(max_positions, dim)
        self.layers = nn.ModuleList(CachedDecoderLayer(dim, heads, ffn, dropout) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.vocabulary = nn.Linear(dim, self.first_pointer)
        self.scale = 1.0 / math.sqrt(dim)

    @classmethod
    def of(cls, word_size: int, config: PointerConfig) -> PointerDecoder:
        return cls(
            word_size,
            len(config.labels),
            config.decoder_dim,
            config.decoder_layers,
            config.decoder_heads,
            config.decoder_ffn,
            config.decoder_dropout,
            config.max_positions,
        )

    def project(self, word_states: torch.Tensor, word_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Word states → the decoder's memory and pointer keys ([B, N, D] each), once per sentence."""
        memory = self.memory_projection(word_states) * word_mask.unsqueeze(-1)
        return memory, self.pointer_key(memory)

    def cross(self, memory: torch.Tensor) -> list[torch.Tensor]:
        """[B, N, D] memory → every layer's cross-attention keys and values [B, H, N, hd] (key, value, …)."""
        out: list[torch.Tensor] = []
        for layer in self.layers:
            assert isinstance(layer, CachedDecoderLayer)
            out += layer.cross_keys_values(memory)
        return out

    def empty_cache(self, rows: int, device: torch.device) -> list[torch.Tensor]:
        return [torch.zeros(rows, self.heads, 0, self.head_dim, device=device) for _ in range(2 * len(self.layers))]

    def logits(
        self,
        memory: torch.Tensor,
        memory_mask: torch.Tensor,
        pointer_keys: torch.Tensor,
        cross: list[torch.Tensor],
        row_sentence: torch.Tensor,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        past: list[torch.Tensor],
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """tokens, positions [R, T] → logits [R, T, first_pointer + N] and the grown cache. Per
        sentence: memory, memory_mask, pointer_keys and `cross` (from `cross(memory)`)."""
        padding = memory_mask.index_select(0, row_sentence) < 0.5
        words = memory.shape[1]
        pointed = (tokens - self.first_pointer).clamp(min=0, max=words - 1)
        # the pointed words' memory, read from their sentences' rows: [R, T, D]
        flat = (row_sentence.unsqueeze(1) * words + pointed).reshape(-1)
        word_vectors = memory.reshape(-1, memory.shape[2]).index_select(0, flat).reshape(*pointed.shape, -1)
        own = self.tokens(tokens.clamp(max=self.first_pointer - 1))
        x = torch.where((tokens >= self.first_pointer).unsqueeze(-1), self.word_input(word_vectors), own)
        x = x + self.position(positions.clamp(max=self.max_positions - 1))
        present: list[torch.Tensor] = []
        rows_cross = [c.index_select(0, row_sentence) for c in cross]
        for i, layer in enumerate(self.layers):
            x, keys, values = layer(x, rows_cross[2 * i], rows_cross[2 * i + 1], padding, past[2 * i], past[2 * i + 1])
            present += [keys, values]
        x = self.norm(x)
        keys = pointer_keys.index_select(0, row_sentence)
        pointers = torch.matmul(self.pointer_query(x), keys.transpose(1, 2)) * self.scale
        pointers = pointers.masked_fill(padding.unsqueeze(1), MASKED)
        return torch.cat([self.vocabulary(x), pointers], dim=-1), present


class PointerStepGraph(nn.Module):
    """One decoding step for R rows: inputs (memory, memory_mask, pointer_keys, row_sentence,
    tokens, positions, cache_order, *cross, *past) → (logits [R, V], *present). `cross`: each
    layer's cross-attention keys and values per sentence (the encoder graph's). `cache_order`
    picks each row's cache from the previous step's rows (beam search reorders; greedy passes
    0 … R-1), so the reorder runs where the cache lives. Tokens and positions [R, T] take T steps
    at once (logits [R, T, V]): eager only, for export parity's teacher-forced check
    (export.teacher_forcing)."""

    def __init__(self, decoder: PointerDecoder) -> None:
        super().__init__()
        self.decoder = decoder

    def forward(  # type: ignore[no-untyped-def]
        self, memory, memory_mask, pointer_keys, row_sentence, tokens, positions, cache_order, *cross_and_past
    ):
        layers = len(self.decoder.layers)
        cross = list(cross_and_past[: 2 * layers])
        ordered = [p.index_select(0, cache_order) for p in cross_and_past[2 * layers :]]
        tokens, positions, one_step = as_steps(tokens, positions)
        logits, present = self.decoder.logits(
            memory, memory_mask, pointer_keys, cross, row_sentence, tokens, positions, ordered
        )
        return (logits[:, 0] if one_step else logits, *present)
