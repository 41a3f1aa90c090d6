"""GNER's seq2seq network (torch): the backbone (+ LoRA) reads the prompt, and a decoder built
from the same backbone writes the tagged sentence ("bert2bert", as transformers' encoder-decoder
models warm-start BERT as a decoder).

Each decoder layer is the backbone layer's own post-norm block — self-attention (now causal, with a
key/value cache), feed-forward — plus a cross-attention block initialised from that layer's
self-attention. Every backbone-initialised linear stays frozen and learns a low-rank delta, so
the committed weights are deltas, not a second copy of the backbone. Token embeddings and the
output projection are the backbone's word embeddings (tied, frozen).

The graphs: `encoder` (prompt → the cross-attention keys and values of every decoder layer,
computed once per sentence) and `decoder` (one step for R rows with its cache).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from nerserve.ner.archs.gner.config import GnerConfig
from nerserve.ner.archs.gner.step_decoder import StepDecoder
from nerserve.ner.archs.gner.t5 import T5Decoder
from nerserve.ner.attention import later_positions
from nerserve.ner.text.chars import SHAPE_VOCAB_SIZE
from nerserve.ner.torch_graph import as_steps

MASKED = -1e4


class LowRankLinear(nn.Module):
    """A frozen linear map plus a trainable low-rank delta (B starts at zero: the copy is exact)."""

    weight: torch.Tensor
    bias: torch.Tensor

    def __init__(self, base: nn.Linear, rank: int) -> None:
        super().__init__()
        self.register_buffer("weight", base.weight.detach().clone(), persistent=False)
        self.register_buffer("bias", base.bias.detach().clone(), persistent=False)
        self.lora_a = nn.Parameter(torch.randn(rank, base.in_features) / math.sqrt(base.in_features))
        self.lora_b = nn.Parameter(torch.zeros(base.out_features, rank))
        self.scale = 2.0  # alpha = 2 × rank
        self.folded = False  # export folds the delta into the weight (a Python flag: traced as a constant)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.folded:
            return F.linear(x, self.weight, self.bias)
        return F.linear(x, self.weight, self.bias) + F.linear(F.linear(x, self.lora_a), self.lora_b) * self.scale

    def fold(self) -> None:
        """Add the delta into the weight (export: one matrix product instead of three)."""
        if not self.folded:
            with torch.no_grad():
                self.weight += (self.lora_b @ self.lora_a) * self.scale
            self.folded = True


def plain(module: nn.Module) -> nn.Linear:
    """The original linear of a (possibly LoRA-wrapped) backbone module."""
    base = getattr(module, "base_layer", module)
    assert isinstance(base, nn.Linear)
    return base


def layer_norm_copy(norm: nn.LayerNorm) -> nn.LayerNorm:
    copy = nn.LayerNorm(norm.normalized_shape, eps=norm.eps)
    copy.load_state_dict(norm.state_dict())
    return copy


def split_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    return x.reshape(x.shape[0], x.shape[1], heads, -1).transpose(1, 2)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, blocked: torch.Tensor) -> torch.Tensor:
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    out = torch.softmax(scores.masked_fill(blocked, MASKED), dim=-1) @ v
    return out.transpose(1, 2).reshape(out.shape[0], out.shape[2], -1)


class DecoderLayer(nn.Module):
    def __init__(self, layer: Any, heads: int, rank: int, cross_rank: int) -> None:
        super().__init__()
        attention = layer.attention
        self.heads = heads
        self.query, self.key, self.value = (
            LowRankLinear(plain(attention.self.query), rank),
            LowRankLinear(plain(attention.self.key), rank),
            LowRankLinear(plain(attention.self.value), rank),
        )
        self.self_out = LowRankLinear(plain(attention.output.dense), rank)
        self.self_norm = layer_norm_copy(attention.output.LayerNorm)
        self.cross_query = LowRankLinear(plain(attention.self.query), cross_rank)
        self.cross_key = LowRankLinear(plain(attention.self.key), cross_rank)
        self.cross_value = LowRankLinear(plain(attention.self.value), cross_rank)
        self.cross_out = LowRankLinear(plain(attention.output.dense), cross_rank)
        self.cross_norm = layer_norm_copy(attention.output.LayerNorm)
        self.ffn_in = LowRankLinear(plain(layer.intermediate.dense), rank)
        self.ffn_out = LowRankLinear(plain(layer.output.dense), rank)
        self.ffn_norm = layer_norm_copy(layer.output.LayerNorm)

    def cross_keys_values(self, memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return split_heads(self.cross_key(memory), self.heads), split_heads(self.cross_value(memory), self.heads)

    def forward(
        self,
        x: torch.Tensor,
        cross_key: torch.Tensor,
        cross_value: torch.Tensor,
        padding: torch.Tensor,
        past_key: torch.Tensor,
        past_value: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        keys = torch.cat([past_key, split_heads(self.key(x), self.heads)], dim=2)
        values = torch.cat([past_value, split_heads(self.value(x), self.heads)], dim=2)
        past, new = past_key.shape[2], x.shape[1]
        later = later_positions(past, new, x.device)
        x = self.self_norm(x + self.self_out(attend(split_heads(self.query(x), self.heads), keys, values, later)))
        blocked = padding.unsqueeze(1).unsqueeze(1)  # [R, 1, 1, S]
        x = self.cross_norm(
            x + self.cross_out(attend(split_heads(self.cross_query(x), self.heads), cross_key, cross_value, blocked))
        )
        x = self.ffn_norm(x + self.ffn_out(F.gelu(self.ffn_in(x))))
        return x, keys, values


class BackboneDecoder(StepDecoder):
    """The backbone's layers as a cached decoder with cross-attention, and its tied output."""

    word_embeddings: torch.Tensor
    position_embeddings: torch.Tensor
    type_embedding: torch.Tensor
    layers: nn.ModuleList

    def __init__(self, backbone: Any, config: GnerConfig) -> None:
        super().__init__()
        embeddings = backbone.embeddings
        settings = backbone.config
        self.heads = int(settings.num_attention_heads)
        self.head_dim = int(settings.hidden_size) // self.heads
        self.register_buffer("word_embeddings", embeddings.word_embeddings.weight.detach().clone(), persistent=False)
        self.register_buffer("position_embeddings", embeddings.position_embeddings.weight.detach().clone(), persistent=False)
        # a number, not the table's size read in `states`: a trace would make that size a host
        # tensor, which `clamp` on a GPU refuses beside the positions
        self.last_position = int(self.position_embeddings.shape[0]) - 1
        self.register_buffer("type_embedding", embeddings.token_type_embeddings.weight[0].detach().clone(), persistent=False)
        self.embedding_norm = layer_norm_copy(embeddings.LayerNorm)
        self.layers = nn.ModuleList(
            DecoderLayer(layer, self.heads, config.decoder_rank, config.cross_rank) for layer in backbone.encoder.layer
        )
        hidden = int(settings.hidden_size)
        self.transform = nn.Linear(hidden, hidden)
        with torch.no_grad():  # the prediction transform starts as the identity
            self.transform.weight.copy_(torch.eye(hidden))
            self.transform.bias.zero_()
        self.transform_norm = nn.LayerNorm(hidden, eps=float(settings.layer_norm_eps))
        self.output_bias = nn.Parameter(torch.zeros(self.word_embeddings.shape[0]))

    @property
    def vocabulary_size(self) -> int:
        return int(self.word_embeddings.shape[0])

    def cross(self, memory: torch.Tensor) -> list[torch.Tensor]:
        """[key, value] per layer, [B, H, S, hd] each."""
        out: list[torch.Tensor] = []
        for layer in self.layers:
            assert isinstance(layer, DecoderLayer)
            out += layer.cross_keys_values(memory)
        return out

    def scores(self, states: torch.Tensor, vocabulary: torch.Tensor | None = None) -> torch.Tensor:
        """Output scores of every token, or of the `vocabulary` ids only (training's sampled softmax)."""
        if vocabulary is None:
            return F.linear(states, self.word_embeddings, self.output_bias)
        return F.linear(states, self.word_embeddings.index_select(0, vocabulary), self.output_bias.index_select(0, vocabulary))

    def states(
        self,
        cross: list[torch.Tensor],
        padding: torch.Tensor,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        past: list[torch.Tensor],
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        positions = positions.clamp(max=self.last_position)
        x = F.embedding(tokens, self.word_embeddings) + F.embedding(positions, self.position_embeddings)
        x = self.embedding_norm(x + self.type_embedding)
        present: list[torch.Tensor] = []
        for i, layer in enumerate(self.layers):
            x, keys, values = layer(x, cross[2 * i], cross[2 * i + 1], padding, past[2 * i], past[2 * i + 1])
            present += [keys, values]
        return self.transform_norm(F.gelu(self.transform(x))), present


def t5_decoder(encoder: Any) -> T5Decoder:
    """The decoder of the seq2seq folder whose encoder stack is the backbone (ner.encoder.load_backbone)."""
    from transformers import AutoModelForSeq2SeqLM

    folder = encoder.config._name_or_path
    return T5Decoder(AutoModelForSeq2SeqLM.from_pretrained(folder))


class GnerNetwork(nn.Module):
    def __init__(self, backbone: Any, hidden_size: int, config: GnerConfig) -> None:
        super().__init__()
        self.config = config
        self.backbone: Any = backbone
        base = backbone.get_base_model() if hasattr(backbone, "get_base_model") else backbone
        # casing, which the uncased backbone throws away, added to each sentence sub-word's state
        self.shape_embedding = nn.Embedding(SHAPE_VOCAB_SIZE, hidden_size, padding_idx=0)
        nn.init.zeros_(self.shape_embedding.weight)
        self.decoder: BackboneDecoder | T5Decoder = (
            BackboneDecoder(base, config) if config.kind == "bert2bert" else t5_decoder(base)
        )

    def memory(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, shape_ids: torch.Tensor) -> torch.Tensor:
        states = self.backbone(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return states + self.shape_embedding(shape_ids)

    def graphs(self) -> dict[str, nn.Module]:
        return {
            "encoder": GnerEncoderGraph(self),
            "decoder": GnerStepGraph(self.decoder),
            "rows": RowsGraph(),
            "scores": ScoresGraph(self.decoder),
        }


class GnerEncoderGraph(nn.Module):
    """(input_ids, attention_mask, shape_ids) [B, S] → cross_key_<i>, cross_value_<i> [B, H, S, hd]."""

    def __init__(self, network: GnerNetwork) -> None:
        super().__init__()
        self.network = network

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, shape_ids: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        return tuple(self.network.decoder.cross(self.network.memory(input_ids, attention_mask, shape_ids)))


class GnerStepGraph(nn.Module):
    """One step for R rows: (memory_mask, tokens, positions, vocabulary, *cross, *past) → (logits
    [R, A] of the A `vocabulary` tokens, states [R, D], *present), every input but the vocabulary
    per row (the `rows` graph selects them when a loop's rows are not the batch's sentences in
    order). Tokens and positions [R, T] take T steps at once (logits [R, T, A]): eager only, where
    export parity checks a loop's steps in one teacher-forced pass (export.teacher_forcing)."""

    def __init__(self, decoder: BackboneDecoder | T5Decoder) -> None:
        super().__init__()
        self.decoder = decoder

    def forward(self, memory_mask, tokens, positions, vocabulary, *cross_and_past):  # type: ignore[no-untyped-def]
        layers = len(self.decoder.layers)
        cross, past = list(cross_and_past[: 2 * layers]), list(cross_and_past[2 * layers :])
        tokens, positions, one_step = as_steps(tokens, positions)
        states, present = self.decoder.states(cross, memory_mask < 0.5, tokens, positions, past)
        logits = self.decoder.scores(states, vocabulary)
        if one_step:
            return (logits.squeeze(1), states.squeeze(1), *present)
        return (logits, states, *present)


class ScoresGraph(nn.Module):
    """states [R, D] → every token's scores [R, V] (free generation's)."""

    def __init__(self, decoder: BackboneDecoder | T5Decoder) -> None:
        super().__init__()
        self.decoder = decoder

    def forward(self, states: torch.Tensor) -> torch.Tensor:
        return self.decoder.scores(states)


class RowsGraph(nn.Module):
    """(row_index [R], *tensors [N, …]) → each tensor's rows in that order: a loop's cross keys and
    values per row, once per loop, and beam search's reordered cache, once per step."""

    def forward(self, row_index, *tensors):  # type: ignore[no-untyped-def]
        return tuple(t.index_select(0, row_index) for t in tensors)
