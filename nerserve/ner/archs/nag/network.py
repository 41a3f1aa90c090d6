"""The trainable NAG-NER network: shared word encoder + start/memory head + parallel decoder."""

from __future__ import annotations

import torch
from torch import nn

from nerserve.ner.archs.nag.config import NagConfig
from nerserve.ner.archs.nag.graphs import NagDecoderGraph, NagEncoderGraph, NagEncoderHead
from nerserve.ner.encoder import EncoderConfig, WordEncoder


def position_table(backbone: nn.Module) -> torch.Tensor | None:
    """The backbone's absolute position embeddings (BERT/RoBERTa-style), if it has any."""
    for name, module in backbone.named_modules():
        if name.endswith("embeddings.position_embeddings") and isinstance(module, nn.Embedding):
            return module.weight
    return None


class NagNetwork(nn.Module):
    def __init__(self, backbone: nn.Module, hidden_size: int, config: NagConfig) -> None:
        super().__init__()
        self.config = config
        self.encoder = WordEncoder(backbone, hidden_size, EncoderConfig.from_dict(config.encoder))
        self.head = NagEncoderHead(self.encoder.output_size, hidden_size, config)
        self.decoder = NagDecoderGraph(config, hidden_size, position_table(backbone))

    def graphs(self) -> dict[str, nn.Module]:
        """The exportable sub-modules, by the names the program runs them under."""
        return {"encoder": NagEncoderGraph(self.encoder, self.head), "decoder": self.decoder}
