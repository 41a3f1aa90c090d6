"""NAG-NER: entity-start counts + a non-autoregressive decoder that writes every entity at once."""

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from nerserve.ner.archs.base import ArchitectureSpec, Capabilities, Tuning
from nerserve.ner.archs.nag.config import NagConfig, NagDecodeOptions
from nerserve.ner.archs.nag.program import NagProgram
from nerserve.ner.archs.nag.signatures import signatures


def loosest_start_threshold(options: NagDecodeOptions, grid: Mapping[str, Sequence[Any]]) -> NagDecodeOptions:
    """Run the graphs once for the whole grid: τ_s selects the decoder's queries, and a stricter
    τ_s only drops some of them (a query's tokens do not depend on the others)."""
    return replace(options, start_threshold=max(grid["start_threshold"]))


SPEC = ArchitectureSpec(
    name="nag",
    config=NagConfig,
    options=NagDecodeOptions,
    program=NagProgram,
    signatures=signatures,
    capabilities=Capabilities(nested=True, discontinuous=True),
    int8_graphs=("encoder", "decoder"),
    tuning=Tuning(
        {"start_threshold": (0.2, 0.3, 0.4, 0.5, 0.6, 0.7), "threshold": (0.0, 0.3, 0.4, 0.5, 0.6)},
        loosest_start_threshold,
    ),
    network="nerserve.ner.archs.nag.network:NagNetwork",
    trainer="nerserve.ner.training.nag_trainer:train_nag",
)
