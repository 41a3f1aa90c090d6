"""The trainable SetGNER network: shared word encoder + head/count detectors + pointer decoder."""

from __future__ import annotations

import torch
from torch import nn

from nerserve.ner.archs.feeds import ENCODER_INPUTS
from nerserve.ner.archs.pointer.network import PointerDecoder, PointerStepGraph
from nerserve.ner.archs.setgen.config import SetgenConfig
from nerserve.ner.encoder import EncoderConfig, WordEncoder


class Detectors(nn.Module):
    """Per word: logits of [not in an entity, inside one, an entity's tail, an entity's head]
    (independent, BCE) and of how many entities start there (0 … max_count)."""

    def __init__(self, word_size: int, dim: int, max_count: int) -> None:
        super().__init__()
        self.dropout = nn.Dropout(0.3)
        self.parts = nn.Sequential(nn.Linear(word_size, dim), nn.GELU(), nn.Linear(dim, 4))
        self.counts = nn.Sequential(nn.Linear(word_size, dim), nn.GELU(), nn.Linear(dim, max_count + 1))

    def forward(self, states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        states = self.dropout(states)
        return self.parts(states), self.counts(states)


class SetgenEncoderGraph(nn.Module):
    """ENCODER_INPUTS → part_probs [B, N, 4], count_probs [B, N, max_count + 1], memory and
    pointer_keys [B, N, D] and each decoder layer's cross-attention keys and values [B, H, N, hd]
    (what the decoder reads of a sentence, once per sentence)."""

    def __init__(self, network: SetgenNetwork) -> None:
        super().__init__()
        self.encoder, self.detectors, self.decoder = network.encoder, network.detectors, network.decoder

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        states, _ = self.encoder(*inputs)
        parts, counts = self.detectors(states)
        memory, keys = self.decoder.project(states, inputs[ENCODER_INPUTS.index("word_mask")])
        return torch.sigmoid(parts), torch.softmax(counts, dim=-1), memory, keys, *self.decoder.cross(memory)


class SetgenNetwork(nn.Module):
    def __init__(self, backbone: nn.Module, hidden_size: int, config: SetgenConfig) -> None:
        super().__init__()
        self.config = config
        self.encoder = WordEncoder(backbone, hidden_size, EncoderConfig.from_dict(config.encoder))
        self.detectors = Detectors(self.encoder.output_size, config.decoder_dim, config.max_count)
        self.decoder = PointerDecoder.of(self.encoder.output_size, config)

    def graphs(self) -> dict[str, nn.Module]:
        """The exportable sub-modules, by the names the program runs them under."""
        return {"encoder": SetgenEncoderGraph(self), "decoder": PointerStepGraph(self.decoder)}
