"""The trainable span network: shared word encoder + span-proposal graph."""

from __future__ import annotations

from dataclasses import fields

from torch import nn

from ner.archs.span.config import SpanConfig
from ner.archs.span.graphs import SpanProposalGraph
from ner.encoder import EncoderConfig, WordEncoder


def encoder_config(config: SpanConfig) -> EncoderConfig:
    known = {f.name for f in fields(EncoderConfig)}
    return EncoderConfig(**{k: v for k, v in config.encoder.items() if k in known})


class SpanNetwork(nn.Module):
    def __init__(self, backbone: nn.Module, hidden_size: int, config: SpanConfig) -> None:
        super().__init__()
        self.config = config
        self.encoder = WordEncoder(backbone, hidden_size, encoder_config(config))
        self.head = SpanProposalGraph(
            self.encoder.output_size,
            self.encoder.context_size,
            len(config.labels),
            config.head_hidden,
            config.head_dropout,
            config.range_levels,
        )

    def graphs(self) -> dict[str, nn.Module]:
        """The exportable sub-modules, by the names the program runs them under."""
        return {"encoder": self.encoder, "span_proposal": self.head}
