"""Hyper-parameters and decoding options of GNER (no torch).

An open-label model: `labels` in the config are the names it was trained with (what `/models`
lists); each request brings its own, carried to the program in `GnerOptions.labels`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import ConfigDict, Field
from pydantic.dataclasses import dataclass as pydantic_dataclass

from nerserve.ner.archs.config_io import open_label_config_dict, open_label_config_from_dict
from nerserve.ner.decoding.overlap import Overlap

# The kinds of seq2seq network: the backbone as encoder and as a cached decoder initialised from
# it ("bert2bert"), or a Hugging Face encoder-decoder folder such as Flan-T5 / GNER-T5 ("t5").
Seq2SeqKind = Literal["bert2bert", "t5"]


@pydantic_dataclass(frozen=True, config=ConfigDict(extra="forbid", strict=True))
class GnerOptions:
    """Decoding options: defaults come from the manifest; `beams` and `constrained` may be set per
    request, `labels` comes from the request's own `labels` field, `overlap` from the model."""

    beams: int = Field(default=1, ge=1, le=8, description="beam width (1: greedy)")
    constrained: bool = Field(
        default=True, description="write only the next input word and a label of the request (off: free generation + LCS)"
    )
    labels: tuple[str, ...] = Field(default=(), description="the label names to find (from the request's `labels`)")
    overlap: Overlap = "flat"


@dataclass(frozen=True)
class GnerConfig:
    labels: tuple[str, ...]  # label names seen in training (informative: requests bring their own)
    kind: Seq2SeqKind = "bert2bert"
    # the instruction before the label list and the sentence; GNER-T5 checkpoints need the
    # paper's own wording, the bert2bert model was trained with this short one
    instruction: str = "labels:"
    label_separator: str = ","
    sentence_marker: str = "sentence:"
    # the decoder's shape (from the backbone or the seq2seq folder): what the step graph's cache holds
    decoder_layers: int = 6
    decoder_heads: int = 12
    head_dim: int = 32
    decoder_rank: int = 16  # low-rank deltas on the decoder's backbone-initialised linears
    cross_rank: int = 32  # and on its cross-attention (initialised from the self-attention)
    max_label_tokens: int = 12  # the new-token bound: per word, its sub-words + 2 + this
    decode: GnerOptions = field(default_factory=lambda: GnerOptions())

    def to_dict(self) -> dict[str, Any]:
        return open_label_config_dict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> GnerConfig:
        return open_label_config_from_dict(cls, values, GnerOptions)
