"""Hyper-parameters, label set and decoding defaults of DiffusionNER (no torch)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from pydantic import ConfigDict, Field, model_validator
from pydantic.dataclasses import dataclass as pydantic_dataclass

from nerserve.ner.archs.config_io import config_from_dict
from nerserve.ner.decoding.overlap import Overlap

Schedule = Literal["cosine", "linear"]
MAX_PROPOSAL_STEPS = 3000  # 10 × the default 60 proposals × 5 steps
SpanPooling = Literal["lrconcat", "mean"]


@pydantic_dataclass(frozen=True, config=ConfigDict(extra="forbid", strict=True))
class DiffusionDecodeOptions:
    """Sampling and decoding options: defaults come from the manifest; all but `overlap` may be
    set per request, within these bounds (cost grows as proposals × steps)."""

    proposals: int = Field(default=60, ge=1, le=500, description="K: noisy spans denoised per sentence")
    steps: int = Field(default=5, ge=1, le=50, description="DDIM denoising steps (head evaluations; more: slower)")
    seed: int = Field(default=48, ge=0, le=2**32 - 1, description="noise seed (each sentence draws its own noise from it)")
    threshold: float = Field(
        default=2.5 / 3, ge=0.0, le=1.0, description="φ/3: minimum mean of the type and both boundary probabilities"
    )
    overlap: Overlap = "flat"  # flat: no shared words; nested: no crossing spans

    @model_validator(mode="after")
    def bounded_cost(self) -> DiffusionDecodeOptions:
        """Each bound alone still allows 500 × 50, 83× the default's cost per sentence: one
        request could then hold a batch for everyone. The product is capped at 10× the default."""
        if self.proposals * self.steps > MAX_PROPOSAL_STEPS:
            raise ValueError(
                f"proposals × steps = {self.proposals} × {self.steps} = {self.proposals * self.steps}, "
                f"at most {MAX_PROPOSAL_STEPS} (the cost of a sentence grows as their product)"
            )
        return self


@dataclass(frozen=True)
class DiffusionConfig:
    labels: tuple[str, ...]
    encoder: dict[str, Any] = field(default_factory=dict)  # ner.encoder.EncoderConfig fields
    span_layers: int = 2  # span encoder: self-attention among spans + cross-attention to words
    span_heads: int = 8
    span_ffn: int = 1024
    dropout: float = 0.1
    pointer_dim: int = 128  # hidden size of the boundary pointers ([B, K, N, pointer_dim] is their cost)
    span_pooling: SpanPooling = "lrconcat"
    schedule: Schedule = "cosine"
    timesteps: int = 1000  # T
    scale: float = 1.0  # λ: the noise space is [-λ, λ]
    train_proposals: int = 60  # K during training (gold spans repeated to fill it)
    gold_copies: int = 60  # gold entities repeated to this many columns for one-to-many matching; 1: one-to-one
    eta: float = 1.0  # DDIM stochasticity (1: the paper's sampler)
    boundary_weight: float = 1.0  # loss and matching weight of the boundary terms
    decode: DiffusionDecodeOptions = field(default_factory=lambda: DiffusionDecodeOptions())

    def to_dict(self) -> dict[str, Any]:
        values = asdict(self)
        values["labels"] = list(self.labels)
        return values

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> DiffusionConfig:
        return config_from_dict(cls, values, DiffusionDecodeOptions)
