"""setgen — SetGNER (entity set generation): entity heads and how many entities start at each,
then a pointer decoder writes every entity from its head word, all heads in parallel (greedy for
one entity, beam search for several). Flat, nested and discontinuous entities."""

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from nerserve.ner.archs.base import ArchitectureSpec, Capabilities, Tuning
from nerserve.ner.archs.setgen.config import SetgenConfig, SetgenOptions
from nerserve.ner.archs.setgen.program import SetgenProgram
from nerserve.ner.archs.setgen.signatures import signatures


def loosest_head_threshold(options: SetgenOptions, grid: Mapping[str, Sequence[Any]]) -> SetgenOptions:
    """Run the graphs once for the whole grid: a stricter head threshold only drops rows, and a
    row's sequence does not depend on the others."""
    return replace(options, head_threshold=min(grid["head_threshold"]))


SPEC = ArchitectureSpec(
    name="setgen",
    config=SetgenConfig,
    options=SetgenOptions,
    program=SetgenProgram,
    signatures=signatures,
    capabilities=Capabilities(nested=True, discontinuous=True, autoregressive=True),
    tuning=Tuning({"head_threshold": (0.3, 0.4, 0.5, 0.6, 0.7), "threshold": (0.0, 0.3, 0.5)}, loosest_head_threshold),
    network="nerserve.ner.archs.setgen.network:SetgenNetwork",
    trainer="nerserve.ner.training.setgen_trainer:train_setgen",
)
