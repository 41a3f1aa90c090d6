"""Hyper-parameters, label set and decoding options of the span architecture (no torch)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from pydantic import ConfigDict, Field
from pydantic.dataclasses import dataclass as pydantic_dataclass

from nerserve.ner.archs.config_io import config_from_dict
from nerserve.ner.decoding.overlap import Overlap


@pydantic_dataclass(frozen=True, config=ConfigDict(extra="forbid", strict=True))
class DecodeOptions:
    """Decoding options: defaults come from the manifest (tuned on dev); all but `overlap` may be
    set per request, within these bounds."""

    threshold: float = Field(default=0.5, ge=0.0, le=1.0, description="δ: minimum entity score after Soft-NMS")
    filter_threshold: float = Field(
        default=1 / 6, ge=0.0, le=1.0, description="minimum p(entity) of a seed span (the code's spn_filter=5)"
    )
    nms_decay: float = Field(default=0.9, gt=0.0, le=1.0, description="Soft-NMS decay u")
    nms_iou: float = Field(default=0.6, ge=0.0, le=1.0, description="Soft-NMS IoU threshold k")
    overlap: Overlap = "flat"  # flat: no two entities share a word; nested: no crossing spans


@dataclass(frozen=True)
class SpanConfig:
    labels: tuple[str, ...]
    max_width: int = 8  # seed spans of 1..max_width words; the regressor reaches further
    encoder: dict[str, Any] = field(default_factory=dict)  # ner.encoder.EncoderConfig fields
    head_hidden: int = 384
    head_dropout: float = 0.5
    range_levels: int = 9  # sparse-table levels for span max-pooling: exact up to 2**9 words
    iou_filter: float = 0.7  # α1
    iou_classifier: float = 1.0  # α2
    soft_eta: float = 1.0  # η of the soft-example weights
    focal_gamma: float = 2.0
    decode: DecodeOptions = field(default_factory=lambda: DecodeOptions())

    def to_dict(self) -> dict[str, Any]:
        values = asdict(self)
        values["labels"] = list(self.labels)
        return values

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> SpanConfig:
        return config_from_dict(cls, values, DecodeOptions)
