"""Hyper-parameters, label set and decoding options of BARTNER (no torch)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import ConfigDict, Field
from pydantic.dataclasses import dataclass as pydantic_dataclass

from nerserve.ner.archs.config_io import config_from_dict
from nerserve.ner.archs.pointer.config import PointerConfig
from nerserve.ner.decoding.overlap import Overlap


@pydantic_dataclass(frozen=True, config=ConfigDict(extra="forbid", strict=True))
class BartnerOptions:
    """Decoding options: defaults come from the manifest; all but `overlap` may be set per request."""

    beams: int = Field(default=1, ge=1, le=8, description="beam width (1: greedy, as the paper for CoNLL-2003 and GENIA)")
    threshold: float = Field(
        default=0.0, ge=0.0, le=1.0, description="minimum entity score (geometric mean of its token probabilities)"
    )
    overlap: Overlap = "any"


@dataclass(frozen=True)
class BartnerConfig(PointerConfig):
    max_length_words: float = 2.0  # the loop writes at most 10 + this × words tokens (BARTNER's max_len + max_len_a × length)
    decode: BartnerOptions = field(default_factory=lambda: BartnerOptions())

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> BartnerConfig:
        return config_from_dict(cls, values, BartnerOptions)
