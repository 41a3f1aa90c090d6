"""Hyper-parameters, label set and decoding defaults of the span architecture (stdlib only)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from ner.archs.config_io import config_from_dict

Overlap = Literal["flat", "nested"]


@dataclass(frozen=True)
class DecodeOptions:
    """Per-request decoding options; defaults come from the manifest (tuned on dev)."""

    threshold: float = 0.5  # δ: keep entities scoring above it after Soft-NMS
    filter_threshold: float = 1 / 6  # keep a seed when p(entity) exceeds it (the code's spn_filter=5)
    nms_decay: float = 0.9  # u
    nms_iou: float = 0.6  # k
    overlap: Overlap = "flat"  # flat: no two entities share a word; nested: no crossing spans

    def replace(self, **changes: Any) -> DecodeOptions:
        values = asdict(self)
        values.update(changes)
        return DecodeOptions(**values)


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
    decode: DecodeOptions = field(default_factory=DecodeOptions)

    def to_dict(self) -> dict[str, Any]:
        values = asdict(self)
        values["labels"] = list(self.labels)
        return values

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> SpanConfig:
        return config_from_dict(cls, values, DecodeOptions)
