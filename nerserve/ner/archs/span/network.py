"""The trainable span network: shared word encoder + span-proposal graph."""

from __future__ import annotations

from torch import nn

from nerserve.ner.archs.span.config import SpanConfig
from nerserve.ner.archs.span.graphs import SpanProposalGraph
from nerserve.ner.encoder import EncoderConfig, WordEncoder


class SpanNetwork(nn.Module):
    def __init__(self, backbone: nn.Module, hidden_size: int, config: SpanConfig) -> None:
        super().__init__()
        self.config = config
        self.encoder = WordEncoder(backbone, hidden_size, EncoderConfig.from_dict(config.encoder))
        self.head = SpanProposalGraph(
            self.encoder.output_size,
            self.encoder.context_size,
            len(config.labels),
            config.head_hidden,
            config.head_dropout,
            config.range_levels,
            config.max_width,
        )

    def graphs(self) -> dict[str, nn.Module]:
        """The exportable sub-modules, by the names the program runs them under."""
        return {"encoder": self.encoder, "span_proposal": self.head}
