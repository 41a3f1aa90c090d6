"""The architectures the project serves, and how to build each one's program from a manifest and
a set of graphs (design layer 2: numpy, no torch)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ner.archs.nag.config import NagConfig
from ner.archs.nag.program import NagProgram
from ner.archs.span.config import SpanConfig
from ner.archs.span.program import SpanProgram
from ner.graph import Graph
from ner.signatures import AXES, NAG_AXES, NAG_GRAPHS, SPAN_GRAPHS, Signature
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


ARCHITECTURES: dict[str, ArchitectureSpec] = {
    "span": ArchitectureSpec("span", SPAN_GRAPHS, AXES, True, False, False, _span_program, SpanOptions),
    "nag": ArchitectureSpec("nag", NAG_GRAPHS, NAG_AXES, True, True, False, _nag_program, NagOptions),
}


def architecture(name: str) -> ArchitectureSpec:
    try:
        return ARCHITECTURES[name]
    except KeyError:
        raise ValueError(f"unknown architecture {name!r}; known: {', '.join(ARCHITECTURES)}") from None
