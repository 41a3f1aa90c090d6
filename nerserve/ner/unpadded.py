"""A BERT-style backbone over a batch's real sub-words only, for the exported ONNX encoders.

Packed rows still carry padding at their ends (about a tenth of a CoNLL-2003 batch's positions), and
a backbone run on the rows computes every position-wise layer (the projections, the feed-forward
products, the GELUs, the layer norms) on that padding too. Here those layers run on the real
positions gathered into one [N, D] matrix; only attention, which needs rows, sees them laid out in
rows again, and the padding there is a copy of some real position's projections that no real query
attends to (segment_attention_mask keeps each position within its own sentence). The real
positions' states are the padded backbone's, to float rounding; padding comes out as zeros.

Data-dependent shapes (the count of real positions) make a CUDA pass wait for the host, so the
export applies this to its ONNX graphs, the CPU's serving path, and not to eager torch or TorchScript.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def bert_layers(backbone: nn.Module) -> nn.ModuleList | None:
    """The backbone's transformer layers when it is BERT-shaped (BERT, RoBERTa, ELECTRA with embeddings
    as wide as its layers: embeddings, then layers of self-attention with query/key/value projections
    and absolute positions), else None: another backbone runs on its padded rows."""
    config: Any = getattr(backbone, "config", None)
    layers = getattr(getattr(backbone, "encoder", None), "layer", None)
    if config is None or not isinstance(layers, nn.ModuleList) or not hasattr(backbone, "embeddings"):
        return None
    if hasattr(backbone, "embeddings_project"):  # ELECTRA's projection of narrower embeddings
        return None
    if getattr(config, "position_embedding_type", "absolute") != "absolute" or getattr(config, "is_decoder", False):
        return None
    for layer in layers:
        attention = getattr(getattr(layer, "attention", None), "self", None)
        parts = (getattr(attention, name, None) for name in ("query", "key", "value"))
        if not all(isinstance(part, nn.Module) for part in parts):
            return None
        if not (hasattr(layer.attention, "output") and hasattr(layer, "intermediate") and hasattr(layer, "output")):
            return None
    return layers


def real_subword_states(
    backbone: Any,
    layers: nn.ModuleList,
    input_ids: torch.Tensor,
    segment_ids: torch.Tensor,
    position_ids: torch.Tensor | None,
    attention_mask: torch.Tensor,
    last_layers: int,
) -> torch.Tensor:
    """The mean of the backbone's last `last_layers` hidden states (the embeddings count as the
    first), [R, S, D] like the padded backbone's, computed on the real positions (segment_ids > 0)."""
    rows, length = input_ids.shape
    extra = {} if position_ids is None else {"position_ids": position_ids}
    embedded = backbone.embeddings(input_ids=input_ids, **extra)
    is_real = (segment_ids.reshape(-1) > 0).to(torch.int64)
    real = torch.nonzero(is_real).squeeze(1)
    # a row position → 1 + its index among the real positions, or 0 at padding
    in_real = torch.cumsum(is_real, 0) * is_real
    # attention's keys and values at padding: any real position's (none of them is attended to)
    any_real = torch.clamp(in_real - 1, min=0)
    states = embedded.reshape(rows * length, -1).index_select(0, real)
    kept = [states]
    blocks: list[Any] = list(layers)  # a transformers layer's parts, typed by the backbone's own classes
    for layer in blocks:
        attention = layer.attention.self
        shape = (rows, length, attention.num_attention_heads, attention.attention_head_size)
        scaling = getattr(attention, "scaling", attention.attention_head_size**-0.5)
        projections = (attention.query, attention.key, attention.value)
        query, key, value = (_in_rows(projection(states), any_real, shape) for projection in projections)
        scores = torch.matmul(query, key.transpose(2, 3)) * scaling + attention_mask
        attended = torch.matmul(torch.softmax(scores, dim=-1), value).transpose(1, 2)
        context = attended.reshape(rows * length, -1).index_select(0, real)
        after_attention = layer.attention.output(context, states)
        states = layer.output(layer.intermediate(after_attention), after_attention)
        kept.append(states)
    mean = torch.stack(kept[-last_layers:], dim=0).mean(dim=0)
    zero_row = mean.new_zeros(1, mean.shape[1])
    return torch.cat([zero_row, mean]).index_select(0, in_real).reshape(rows, length, -1)


def _in_rows(projected: torch.Tensor, positions: torch.Tensor, shape: tuple[int, int, int, int]) -> torch.Tensor:
    """[N, D] projections of the real positions → [R, H, S, D/H], the row layout attention takes."""
    return projected.index_select(0, positions).reshape(shape).transpose(1, 2)
