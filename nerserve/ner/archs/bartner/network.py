"""The trainable BARTNER-style network: shared word encoder + pointer decoder (the autoregressive
reference the papers' speed-ups are measured against, here on the same encoder as the others)."""

from __future__ import annotations

import torch
from torch import nn

from nerserve.ner.archs.bartner.config import BartnerConfig
from nerserve.ner.archs.feeds import ENCODER_INPUTS
from nerserve.ner.archs.pointer.network import PointerDecoder, PointerStepGraph
from nerserve.ner.encoder import EncoderConfig, WordEncoder


class BartnerEncoderGraph(nn.Module):
    """ENCODER_INPUTS → memory, pointer_keys [B, N, D], then each decoder layer's cross-attention
    keys and values [B, H, N, hd]."""

    def __init__(self, network: BartnerNetwork) -> None:
        super().__init__()
        self.encoder, self.decoder = network.encoder, network.decoder

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        states, _ = self.encoder(*inputs)
        memory, keys = self.decoder.project(states, inputs[ENCODER_INPUTS.index("word_mask")])
        return memory, keys, *self.decoder.cross(memory)


class BartnerNetwork(nn.Module):
    def __init__(self, backbone: nn.Module, hidden_size: int, config: BartnerConfig) -> None:
        super().__init__()
        self.config = config
        self.encoder = WordEncoder(backbone, hidden_size, EncoderConfig.from_dict(config.encoder))
        self.decoder = PointerDecoder.of(self.encoder.output_size, config)

    def graphs(self) -> dict[str, nn.Module]:
        return {"encoder": BartnerEncoderGraph(self), "decoder": PointerStepGraph(self.decoder)}
