"""Hyper-parameters, label set, output vocabulary and decoding defaults of NAG-NER (no torch)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from pydantic import ConfigDict, Field
from pydantic.dataclasses import dataclass as pydantic_dataclass

from nerserve.ner.archs.config_io import config_from_dict
from nerserve.ner.decoding.overlap import Overlap

# The decoder's output vocabulary: these specials, then one tag per entity type, then one pointer
# per sub-word position of the sentence (entities are always made of the sentence's own sub-words,
# so the generated "token" is the source position: a copy vocabulary instead of a 30k softmax).
PAD, BOS, EOS, OUTSIDE = 0, 1, 2, 3
SPECIALS = ("<pad>", "<s>", "</s>", "<O>")


@pydantic_dataclass(frozen=True, config=ConfigDict(extra="forbid", strict=True))
class NagDecodeOptions:
    """Decoding options: defaults come from the manifest (τ_s tuned on dev); all but `overlap`
    may be set per request, within these bounds."""

    start_threshold: float = Field(
        default=0.3, gt=0.0, le=1.0, description="τ_s: a word starts entities when p(no entity starts here) < τ_s"
    )
    threshold: float = Field(
        default=0.0, ge=0.0, le=1.0, description="minimum entity score (geometric mean of token probabilities)"
    )
    overlap: Overlap = "any"  # flat: no two entities share a word (the better one wins)


@dataclass(frozen=True)
class NagConfig:
    labels: tuple[str, ...]
    l_max: int = 8  # longest entity in sub-words; the decoder writes l_max + 3 tokens
    o_max: int = 5  # most entities starting at one word
    encoder: dict[str, Any] = field(default_factory=dict)  # ner.encoder.EncoderConfig fields
    decoder_dim: int = 384
    decoder_layers: int = 2
    decoder_heads: int = 6
    decoder_ffn: int = 1024
    decoder_dropout: float = 0.1
    negatives_per_sentence: int = 3  # words with no entity that learn to write "<O> word" per sentence
    decode: NagDecodeOptions = field(default_factory=lambda: NagDecodeOptions())

    @property
    def length(self) -> int:
        return self.l_max + 3  # <s> TYPE sub-words… </s>

    @property
    def fixed_vocabulary(self) -> int:
        return len(SPECIALS) + len(self.labels)

    def type_id(self, label: str) -> int:
        return len(SPECIALS) + self.labels.index(label)

    def to_dict(self) -> dict[str, Any]:
        values = asdict(self)
        values["labels"] = list(self.labels)
        return values

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> NagConfig:
        return config_from_dict(cls, values, NagDecodeOptions)
