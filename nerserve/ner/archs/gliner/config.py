"""Hyper-parameters and decoding options of the label-matching architecture (no torch).

An open-label model: `labels` in the config are the names it was trained with (what `/models`
lists); each request brings its own, carried to the program in `GlinerOptions.labels`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import ConfigDict, Field
from pydantic.dataclasses import dataclass as pydantic_dataclass

from nerserve.ner.archs.config_io import open_label_config_dict, open_label_config_from_dict
from nerserve.ner.decoding.overlap import Overlap


@pydantic_dataclass(frozen=True, config=ConfigDict(extra="forbid", strict=True))
class GlinerOptions:
    """Decoding options: defaults come from the manifest (tuned on dev); `threshold` and `nested`
    may be set per request, `labels` comes from the request's own `labels` field."""

    threshold: float = Field(default=0.5, ge=0.0, le=1.0, description="minimum match score of a (span, label) pair")
    nested: bool = Field(default=False, description="also return entities inside entities (never crossing ones)")
    labels: tuple[str, ...] = Field(default=(), description="the label names to find (from the request's `labels`)")
    overlap: Overlap = "nested"  # the most the model returns (with `nested`); flat otherwise


@dataclass(frozen=True)
class GlinerConfig:
    labels: tuple[str, ...]  # label names seen in training (informative: requests bring their own)
    max_width: int = 12  # candidate spans of 1..max_width words
    labels_per_pass: int = 25  # a longer label list is split over several passes of the encoder
    encoder: dict[str, Any] = field(default_factory=dict)  # ner.encoder.EncoderConfig fields
    hidden: int = 384  # the span and label projections' width
    dropout: float = 0.3
    marker: str = "[MASK]"  # the token before each label name in the prompt
    separator: str = "[SEP]"  # the token between the prompt and the sentence's words
    decode: GlinerOptions = field(default_factory=lambda: GlinerOptions())

    def to_dict(self) -> dict[str, Any]:
        return open_label_config_dict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> GlinerConfig:
        return open_label_config_from_dict(cls, values, GlinerOptions)
