"""A Hugging Face T5-family seq2seq folder (Flan-T5, GNER-T5) as GNER's decoder (torch).

The folder's own decoder blocks are run here step by step with an explicit key/value cache, in
the same shape as the bert2bert decoder (cross-attention keys and values once per sentence, one
step graph), so both export and loop the same way. The arithmetic is T5's: RMS layer norms,
unscaled attention scores, a relative position bias shared by the self-attention layers, the
output scaled by d_model^-0.5 before a tied head. The weights stay frozen: a published GNER-T5
checkpoint is served as trained; only the encoder's LoRA (and the casing embedding) could train.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn import functional as F

from nerserve.ner.archs.gner.step_decoder import StepDecoder

MASKED = -1e4


def split_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    return x.reshape(x.shape[0], x.shape[1], heads, -1).transpose(1, 2)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """T5 attention: no 1/√d scaling; `bias` carries positions and masking."""
    out = torch.softmax(q @ k.transpose(-1, -2) + bias, dim=-1) @ v
    return out.transpose(1, 2).reshape(out.shape[0], out.shape[2], -1)


class T5Decoder(StepDecoder):
    def __init__(self, seq2seq: Any) -> None:
        super().__init__()
        config = seq2seq.config
        decoder = seq2seq.get_decoder()
        self.layers = decoder.block
        self.final_norm = decoder.final_layer_norm
        self.embed = decoder.embed_tokens
        self.head = seq2seq.get_output_embeddings()
        self.heads = int(config.num_heads)
        self.head_dim = int(config.d_kv)
        scaled = getattr(config, "scale_decoder_outputs", getattr(config, "tie_word_embeddings", True))
        self.output_scale = float(config.d_model) ** -0.5 if scaled else 1.0
        self.relative: Any = decoder.block[0].layer[0].SelfAttention
        for parameter in self.parameters():
            parameter.requires_grad_(False)

    @property
    def blocks(self) -> list[Any]:
        """The folder's decoder blocks (transformers' T5Block: self-attention, cross-attention, feed-forward)."""
        return list(self.layers)

    @property
    def vocabulary_size(self) -> int:
        return int(self.head.weight.shape[0])

    def cross(self, memory: torch.Tensor) -> list[torch.Tensor]:
        out: list[torch.Tensor] = []
        for block in self.blocks:
            attention = block.layer[1].EncDecAttention
            out += [split_heads(attention.k(memory), self.heads), split_heads(attention.v(memory), self.heads)]
        return out

    def position_bias(self, positions: torch.Tensor, keys: int) -> torch.Tensor:
        """[R, H, T, K]: T5's bucketed relative position bias, and the causal mask."""
        key_positions = torch.arange(keys, device=positions.device)
        relative = key_positions.view(1, 1, -1) - positions.unsqueeze(-1)  # [R, T, K]
        attention = self.relative
        buckets = attention._relative_position_bucket(
            relative,
            bidirectional=False,
            num_buckets=attention.relative_attention_num_buckets,
            max_distance=attention.relative_attention_max_distance,
        )
        bias = attention.relative_attention_bias(buckets).permute(0, 3, 1, 2)
        return bias + (relative > 0).unsqueeze(1).to(bias.dtype) * MASKED

    def states(
        self,
        cross: list[torch.Tensor],
        padding: torch.Tensor,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        past: list[torch.Tensor],
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        x = self.embed(tokens)
        bias = self.position_bias(positions, past[0].shape[2] + tokens.shape[1])
        cross_bias = padding.unsqueeze(1).unsqueeze(1).to(x.dtype) * MASKED  # [R, 1, 1, S]
        present: list[torch.Tensor] = []
        for i, block in enumerate(self.blocks):
            own, crossing, feed_forward = block.layer[0], block.layer[1], block.layer[2]
            attention = own.SelfAttention
            h = own.layer_norm(x)
            keys = torch.cat([past[2 * i], split_heads(attention.k(h), self.heads)], dim=2)
            values = torch.cat([past[2 * i + 1], split_heads(attention.v(h), self.heads)], dim=2)
            x = x + attention.o(attend(split_heads(attention.q(h), self.heads), keys, values, bias))
            h = crossing.layer_norm(x)
            encdec = crossing.EncDecAttention
            x = x + encdec.o(attend(split_heads(encdec.q(h), self.heads), cross[2 * i], cross[2 * i + 1], cross_bias))
            x = feed_forward(x)
            present += [keys, values]
        return self.final_norm(x) * self.output_scale, present

    def scores(self, states: torch.Tensor, vocabulary: torch.Tensor | None = None) -> torch.Tensor:
        if vocabulary is None:
            return self.head(states)  # type: ignore[no-any-return]
        return F.linear(states, self.head.weight.index_select(0, vocabulary))
