"""The architectures the project serves, and how to build each one's program from a manifest and
a set of graphs (design layer 2: numpy, no torch)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ner.archs.diffusion.config import DiffusionConfig
from ner.archs.diffusion.program import DiffusionProgram
from ner.archs.nag.config import NagConfig
from ner.archs.nag.program import NagProgram
from ner.archs.span.config import SpanConfig
from ner.archs.span.program import SpanProgram
from ner.graph import Graph
from ner.signatures import AXES, DIFFUSION_AXES, DIFFUSION_GRAPHS, NAG_AXES, NAG_GRAPHS, SPAN_GRAPHS, Signature
from ner.text.subword import SubwordEncoder


class SpanOptions(BaseModel):
    """Per-request decoding options of the span architecture (defaults: the model's manifest)."""

    model_config = ConfigDict(extra="forbid")

    threshold: float | None = Field(None, ge=0.0, le=1.0, description="δ: minimum entity score")
    filter_threshold: float | None = Field(None, ge=0.0, le=1.0, description="minimum p(entity) of a seed span")
    nms_iou: float | None = Field(None, ge=0.0, le=1.0, description="Soft-NMS IoU threshold k")
    nms_decay: float | None = Field(None, gt=0.0, le=1.0, description="Soft-NMS decay u")


class NagOptions(BaseModel):
    """Per-request decoding options of NAG-NER (defaults: the model's manifest)."""

    model_config = ConfigDict(extra="forbid")

    start_threshold: float | None = Field(
        None, gt=0.0, le=1.0, description="τ_s: a word starts entities when p(no entity starts here) < τ_s"
    )
    threshold: float | None = Field(None, ge=0.0, le=1.0, description="minimum entity score (mean token probability)")


class DiffusionOptions(BaseModel):
    """Per-request sampling and decoding options of DiffusionNER (defaults: the model's manifest)."""

    model_config = ConfigDict(extra="forbid")

    proposals: int | None = Field(None, ge=1, le=500, description="K: noisy spans denoised per sentence")
    steps: int | None = Field(None, ge=1, le=50, description="DDIM denoising steps (more: slower, often better)")
    seed: int | None = Field(None, ge=0, le=2**32 - 1, description="noise seed (each sentence draws its own noise)")
    threshold: float | None = Field(
        None, ge=0.0, le=1.0, description="minimum entity score (mean of type and boundary probabilities)"
    )


ProgramFactory = Callable[[Mapping[str, Graph], dict[str, Any], SubwordEncoder], Any]


@dataclass(frozen=True)
class ArchitectureSpec:
    name: str
    graphs: dict[str, Signature]
    axes: dict[str, dict[str, tuple[str, ...]]]
    nested: bool
    discontinuous: bool
    open_labels: bool
    build_program: ProgramFactory
    options: type[BaseModel]


def _span_program(graphs: Mapping[str, Graph], config: dict[str, Any], subwords: SubwordEncoder) -> SpanProgram:
    return SpanProgram(graphs, SpanConfig.from_dict(config), subwords)


def _nag_program(graphs: Mapping[str, Graph], config: dict[str, Any], subwords: SubwordEncoder) -> NagProgram:
    return NagProgram(graphs, NagConfig.from_dict(config), subwords)


def _diffusion_program(graphs: Mapping[str, Graph], config: dict[str, Any], subwords: SubwordEncoder) -> DiffusionProgram:
    return DiffusionProgram(graphs, DiffusionConfig.from_dict(config), subwords)


ARCHITECTURES: dict[str, ArchitectureSpec] = {
    "span": ArchitectureSpec("span", SPAN_GRAPHS, AXES, True, False, False, _span_program, SpanOptions),
    "nag": ArchitectureSpec("nag", NAG_GRAPHS, NAG_AXES, True, True, False, _nag_program, NagOptions),
    "diffusion": ArchitectureSpec(
        "diffusion", DIFFUSION_GRAPHS, DIFFUSION_AXES, True, False, False, _diffusion_program, DiffusionOptions
    ),
}


def architecture(name: str) -> ArchitectureSpec:
    try:
        return ARCHITECTURES[name]
    except KeyError:
        raise ValueError(f"unknown architecture {name!r}; known: {', '.join(ARCHITECTURES)}") from None
