"""BARTNER's graphs: the shared encoder (plus the decoder's memory and pointer keys, once per
sentence), then the pointer decoder's step graph with its key/value cache."""

from __future__ import annotations

from nerserve.ner.archs.bartner.config import BartnerConfig
from nerserve.ner.archs.feeds import ENCODER
from nerserve.ner.archs.pointer.signatures import step_graph
from nerserve.ner.graph import GraphSignature

ENCODER_WITH_MEMORY = GraphSignature(
    ENCODER.inputs,
    ("memory", "pointer_keys"),
    {
        **{name: ENCODER.axes[name] for name in ENCODER.inputs},
        "memory": ("batch", "words", ""),
        "pointer_keys": ("batch", "words", ""),
    },
)


def signatures(config: BartnerConfig) -> dict[str, GraphSignature]:
    return {
        "encoder": ENCODER_WITH_MEMORY,
        "decoder": step_graph(config.decoder_layers, config.decoder_heads, config.decoder_dim, config.vocabulary.first_pointer),
    }
