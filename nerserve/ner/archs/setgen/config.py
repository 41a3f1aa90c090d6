"""Hyper-parameters, label set and decoding options of SetGNER (no torch)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import ConfigDict, Field
from pydantic.dataclasses import dataclass as pydantic_dataclass

from nerserve.ner.archs.config_io import config_from_dict
from nerserve.ner.archs.pointer.config import PointerConfig
from nerserve.ner.decoding.overlap import Overlap

# the head/in-entity/tail detector's outputs per word
NOT_IN, INSIDE, TAIL, HEAD = 0, 1, 2, 3


@pydantic_dataclass(frozen=True, config=ConfigDict(extra="forbid", strict=True))
class SetgenOptions:
    """Decoding options: defaults come from the manifest (head threshold tuned on dev); all but
    `overlap` may be set per request, within these bounds."""

    head_threshold: float = Field(
        default=0.5, gt=0.0, le=1.0, description="p(word is an entity head) at or above which it seeds generation"
    )
    beams: int = Field(
        default=4, ge=1, le=8, description="beam width for heads that start several entities (1: greedy everywhere)"
    )
    threshold: float = Field(
        default=0.0, ge=0.0, le=1.0, description="minimum entity score (geometric mean of its token probabilities)"
    )
    overlap: Overlap = "any"


@dataclass(frozen=True)
class SetgenConfig(PointerConfig):
    max_count: int = 4  # most entities generated from one head word
    position_interval: int = 4  # τ: a head's sequence starts at decoder position word index × τ
    negatives_per_sentence: int = 3  # words with no entity head that learn to write fragment/null
    decode: SetgenOptions = field(default_factory=lambda: SetgenOptions())

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> SetgenConfig:
        return config_from_dict(cls, values, SetgenOptions)
