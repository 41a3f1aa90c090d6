"""nn.MultiheadAttention at inference, written so that a trace keeps every size symbolic.

torch's own forward reshapes by Python ints, which the TorchScript-based ONNX exporter keeps as
the example's constants (export then falls back to the much slower torch.export), and in eval
mode it takes a fused fast path that has no ONNX form. Same weights, same function; training
keeps torch's module (its attention dropout).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def multi_head_attention(
    module: nn.MultiheadAttention,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    padding: torch.Tensor | None = None,
) -> torch.Tensor:
    """`module` (batch first, packed input projection) → [B, T, D]; `padding` [B, S] is True where
    a key position is masked (as its key_padding_mask)."""
    dim, heads = module.embed_dim, module.num_heads
    weight, bias = module.in_proj_weight, module.in_proj_bias

    def project(states: torch.Tensor, part: int) -> torch.Tensor:
        rows = slice(part * dim, (part + 1) * dim)
        return F.linear(states, weight[rows], bias[rows]).unflatten(-1, (heads, -1)).transpose(1, 2)  # [B, H, T, D/H]

    mask = None if padding is None else padding[:, None, None, :].logical_not()
    attended = F.scaled_dot_product_attention(project(query, 0), project(key, 1), project(value, 2), attn_mask=mask)
    return module.out_proj(attended.transpose(1, 2).flatten(2))


def later_positions(past: int, new: int, device: torch.device) -> torch.Tensor:
    """[new, past + new] True where a decoder step's position (past + t) may not look: the
    positions after it. A cached step sees all of its cache and itself."""
    keys = torch.arange(past + new, device=device).unsqueeze(0)
    return keys > (past + torch.arange(new, device=device)).unsqueeze(1)
