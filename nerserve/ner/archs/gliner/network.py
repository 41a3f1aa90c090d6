"""The trainable label-matching network (GLiNER, Zaratiana et al., NAACL 2024, on the shared
word encoder): label names and words through the backbone together; each label's vector from its
marker and its name, each span's from its first word, last word and width; the score of a pair is
the sigmoid of their dot product."""

from __future__ import annotations

import torch
from torch import nn

from nerserve.ner.archs.gliner.config import GlinerConfig
from nerserve.ner.encoder import EncoderConfig, WordEncoder, gather_positions, pool_subwords, unpack_rows


class Projection(nn.Module):
    def __init__(self, size_in: int, size_out: int, dropout: float) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(size_in, size_out * 2), nn.GELU(), nn.Dropout(dropout), nn.Linear(size_out * 2, size_out)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)  # type: ignore[no-any-return]


class GlinerNetwork(nn.Module):
    """MATCH_INPUTS → scores [B, S, L]: p(span s is an entity of label l). One graph, "encoder".

    Only the spans worth scoring come in, packed across rows (`spans` [T, 3]: row, first word,
    end word); `span_slots` [B, S] places them back (T: a slot of no span, scored by the bias
    alone). The span layers cost per span, and a batch in arrival order mixes lengths: padded to
    its longest sentence's spans, most of [B, S] would be padding (docs/decisions/open-labels.md)."""

    def __init__(self, backbone: nn.Module, hidden_size: int, config: GlinerConfig) -> None:
        super().__init__()
        self.config = config
        self.encoder = WordEncoder(backbone, hidden_size, EncoderConfig.from_dict(config.encoder))
        self.label_projection = Projection(2 * hidden_size, config.hidden, config.dropout)
        # a span's first linear layer per word, then gathered per span (a linear map of a
        # concatenation is the sum of the maps of its parts): K spans cost gathers, not products
        self.start = nn.Linear(self.encoder.output_size, config.hidden * 2)
        self.end = nn.Linear(self.encoder.output_size, config.hidden * 2, bias=False)
        self.width = nn.Embedding(config.max_width + 1, config.hidden * 2)
        self.span_out = nn.Sequential(nn.GELU(), nn.Dropout(config.dropout), nn.Linear(config.hidden * 2, config.hidden))
        # nearly every pair is a non-entity: starting near p = 0.02 spares the first steps from
        # learning only that
        self.bias = nn.Parameter(torch.tensor(-4.0))

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
        text_index: torch.Tensor,
        label_index: torch.Tensor,
        spans: torch.Tensor,
        span_slots: torch.Tensor,
    ) -> torch.Tensor:
        encoder_inputs = (input_ids, segment_ids, position_ids, token_index, subword_index, subword_mask)
        words = (char_stream, char_index, shape_ids, word_mask, text_index)
        return torch.sigmoid(self.logits(*encoder_inputs, *words, label_index, spans, span_slots))

    def logits(
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
        text_index: torch.Tensor,
        label_index: torch.Tensor,
        spans: torch.Tensor,
        span_slots: torch.Tensor,
    ) -> torch.Tensor:
        encoder = self.encoder
        hidden = unpack_rows(encoder.backbone_states(input_ids, segment_ids, position_ids), token_index)
        prompt_words = pool_subwords(hidden, subword_index, subword_mask, encoder.config.pooling)
        labels = torch.cat([gather_positions(prompt_words, label_index - 1), gather_positions(prompt_words, label_index)], -1)
        label_vectors = self.label_projection(labels)  # [B, L, D]
        words = gather_positions(prompt_words, text_index)
        states = encoder.word_states(words, char_stream, char_index, shape_ids, word_mask)  # [B, N, 2·lstm_hidden]
        rows, starts, ends = spans[:, 0], spans[:, 1], spans[:, 2]
        first = rows * states.shape[1] + starts  # positions in the batch's words, flattened
        span_hidden = (
            self.start(states).flatten(0, 1).index_select(0, first)
            + self.end(states).flatten(0, 1).index_select(0, first + (ends - starts - 1))
            + self.width(torch.clamp(ends - starts, max=self.width.num_embeddings - 1))
        )
        span_vectors = self.span_out(span_hidden)  # [T, D]
        no_span = span_vectors.new_zeros((1, span_vectors.shape[1]))
        slotted = torch.cat([span_vectors, no_span]).index_select(0, span_slots.flatten())
        slotted = slotted.reshape(*span_slots.shape, -1)  # [B, S, D]
        return torch.einsum("bsd,bld->bsl", slotted, label_vectors) + self.bias

    def graphs(self) -> dict[str, nn.Module]:
        return {"encoder": self}
