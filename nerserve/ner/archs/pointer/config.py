"""The pointer decoder's hyper-parameters, shared by the configs of setgen and bartner (no torch)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from nerserve.ner.archs.pointer.vocabulary import Vocabulary


@dataclass(frozen=True)
class PointerConfig:
    labels: tuple[str, ...]
    encoder: dict[str, Any] = field(default_factory=dict)  # ner.encoder.EncoderConfig fields
    decoder_dim: int = 384
    decoder_layers: int = 2
    decoder_heads: int = 6
    decoder_ffn: int = 1024
    decoder_dropout: float = 0.1
    max_positions: int = 1024

    @property
    def vocabulary(self) -> Vocabulary:
        return Vocabulary(self.labels)

    def to_dict(self) -> dict[str, Any]:
        values = asdict(self)
        values["labels"] = list(self.labels)
        return values
