"""NAG-NER's two exportable graphs.

encoder: backbone → word states (shared WordEncoder) → p(number of entities starting at each word)
         [B, N, O_max+1], the decoder's memory (sub-word states fused with their word's state)
         [B, S, D], and one query vector per word [B, N, D].
decoder: one parallel pass over Q queries (sentence, start word, start sub-word position, rank n),
         each l_max + 3 slots → the most likely token per slot and its probability. A token is a
         special (<pad> <s> </s> <O>), an entity type, or a pointer to a sub-word of the sentence.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from nerserve.ner.archs.nag.config import NagConfig
from nerserve.ner.attention import multi_head_attention
from nerserve.ner.encoder import WordEncoder, gather_positions

MASKED = -1e4  # fp16-safe "minus infinity" for pointer logits of padding positions


def decoder_layer(layer: nn.Module, x: torch.Tensor, memory: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
    """`layer` (pre-norm) at inference, its attention traceable (ner/attention.py)."""
    assert isinstance(layer, nn.TransformerDecoderLayer)
    normed = layer.norm1(x)
    x = x + multi_head_attention(layer.self_attn, normed, normed, normed)
    x = x + multi_head_attention(layer.multihead_attn, layer.norm2(x), memory, memory, padding)
    return x + layer.linear2(layer.activation(layer.linear1(layer.norm3(x))))


class NagEncoderHead(nn.Module):
    """The trainable layers on top of the shared word encoder."""

    def __init__(self, word_size: int, hidden_size: int, config: NagConfig) -> None:
        super().__init__()
        dim = config.decoder_dim
        self.dropout = nn.Dropout(0.3)
        self.start = nn.Sequential(nn.Linear(word_size, dim), nn.GELU(), nn.Linear(dim, config.o_max + 1))
        self.memory_subword = nn.Linear(hidden_size, dim)
        self.memory_word = nn.Linear(word_size, dim)
        self.memory_norm = nn.LayerNorm(dim)
        self.word_query = nn.Linear(word_size, dim)

    def forward(
        self, states: torch.Tensor, hidden: torch.Tensor, subword_words: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """→ start logits [B, N, O+1], memory [B, S, D], word queries [B, N, D]."""
        states = self.dropout(states)
        of_subword = gather_positions(states, subword_words)
        memory = self.memory_norm(self.memory_subword(hidden) + self.memory_word(of_subword))
        return self.start(states), memory, self.word_query(states)


class NagEncoderGraph(nn.Module):
    """Inputs NAG_ENCODER_INPUTS → start_probs, memory, word_queries."""

    def __init__(self, encoder: WordEncoder, head: NagEncoderHead) -> None:
        super().__init__()
        self.encoder = encoder
        self.head = head

    def forward(
        self,
        input_ids: torch.Tensor,
        segment_ids: torch.Tensor,
        position_ids: torch.Tensor,
        token_index: torch.Tensor,
        subword_index: torch.Tensor,
        subword_mask: torch.Tensor,
        char_stream: torch.Tensor,
        char_index: torch.Tensor,
        shape_ids: torch.Tensor,
        word_mask: torch.Tensor,
        subword_words: torch.Tensor,
        memory_mask: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        subwords = (input_ids, segment_ids, position_ids, token_index, subword_index, subword_mask)
        states, hidden = self.encoder.encode(*subwords, char_stream, char_index, shape_ids, word_mask)
        start, memory, queries = self.head(states, hidden, subword_words)
        # memory_mask is a graph input so that the decoder graph can take it from the same feed
        return torch.softmax(start, dim=-1), memory * memory_mask.unsqueeze(-1), queries


class NagDecoderGraph(nn.Module):
    """Inputs NAG_DECODER_INPUTS → token_ids [Q, L], token_probs [Q, L]."""

    def __init__(self, config: NagConfig, hidden_size: int, position_table: torch.Tensor | None) -> None:
        super().__init__()
        dim = config.decoder_dim
        self.fixed_vocabulary = config.fixed_vocabulary
        # every slot starts as the mask token plus its decoder position: one learned vector per slot
        self.slots = nn.Parameter(torch.randn(config.length, dim) * 0.02)
        self.rank = nn.Embedding(config.o_max, dim)  # NEPE: the n-th shortest entity at this start
        # WSPE: the backbone's position embedding of the start word's first sub-word (frozen copy)
        if position_table is not None:
            self.start_positions = nn.Embedding.from_pretrained(position_table.detach().clone(), freeze=True)
        else:  # backbones without absolute positions (e.g. T5) learn their own table
            self.start_positions = nn.Embedding(1024, hidden_size)
        self.position_projection = nn.Linear(self.start_positions.embedding_dim, dim)
        self.layers = nn.ModuleList(
            nn.TransformerDecoderLayer(
                dim, config.decoder_heads, config.decoder_ffn, config.decoder_dropout, batch_first=True, norm_first=True
            )
            for _ in range(config.decoder_layers)
        )
        self.norm = nn.LayerNorm(dim)
        self.vocabulary = nn.Linear(dim, self.fixed_vocabulary)
        self.pointer_query = nn.Linear(dim, dim)
        self.pointer_key = nn.Linear(dim, dim)
        self.scale = 1.0 / math.sqrt(dim)

    def logits(
        self,
        memory: torch.Tensor,
        memory_mask: torch.Tensor,
        word_queries: torch.Tensor,
        query_sentence: torch.Tensor,
        query_word: torch.Tensor,
        query_position: torch.Tensor,
        query_rank: torch.Tensor,
    ) -> torch.Tensor:
        """[Q, L, fixed vocabulary + S]: specials and types, then pointers to sub-word positions."""
        words, dim = word_queries.shape[1], word_queries.shape[2]
        start = word_queries.reshape(-1, dim).index_select(0, query_sentence * words + query_word)
        start = start + self.position_projection(self.start_positions(query_position)) + self.rank(query_rank)
        x = self.slots.unsqueeze(0) + start.unsqueeze(1)
        keys = memory.index_select(0, query_sentence)
        padding = memory_mask.index_select(0, query_sentence) < 0.5
        for layer in self.layers:
            x = layer(x, keys, memory_key_padding_mask=padding) if self.training else decoder_layer(layer, x, keys, padding)
        x = self.norm(x)
        pointers = torch.einsum("qld,qsd->qls", self.pointer_query(x), self.pointer_key(keys)) * self.scale
        pointers = pointers.masked_fill(padding.unsqueeze(1), MASKED)
        return torch.cat([self.vocabulary(x), pointers], dim=-1)

    def forward(
        self,
        memory: torch.Tensor,
        memory_mask: torch.Tensor,
        word_queries: torch.Tensor,
        query_sentence: torch.Tensor,
        query_word: torch.Tensor,
        query_position: torch.Tensor,
        query_rank: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.logits(memory, memory_mask, word_queries, query_sentence, query_word, query_position, query_rank)
        probs, ids = torch.softmax(logits, dim=-1).max(dim=-1)
        return ids, probs
