"""The trainable DiffusionNER network: shared word encoder + denoiser."""

from __future__ import annotations

from torch import nn

from nerserve.ner.archs.diffusion.config import DiffusionConfig
from nerserve.ner.archs.diffusion.graphs import DenoiserGraph
from nerserve.ner.encoder import EncoderConfig, WordEncoder


class DiffusionNetwork(nn.Module):
    def __init__(self, backbone: nn.Module, hidden_size: int, config: DiffusionConfig) -> None:
        super().__init__()
        self.config = config
        self.encoder = WordEncoder(backbone, hidden_size, EncoderConfig.from_dict(config.encoder))
        self.denoiser = DenoiserGraph(self.encoder.output_size, config)

    def graphs(self) -> dict[str, nn.Module]:
        """The exportable sub-modules, by the names the program runs them under."""
        return {"encoder": self.encoder, "denoiser": self.denoiser}
