"""BARTNER's graphs: the shared encoder (plus what the pointer decoder reads of a sentence, once
per sentence), then the pointer decoder's step graph with its key/value cache."""

from __future__ import annotations

from nerserve.ner.archs.bartner.config import BartnerConfig
from nerserve.ner.archs.feeds import ENCODER
from nerserve.ner.archs.pointer.signatures import sentence_state_axes, sentence_states, step_graph
from nerserve.ner.graph import GraphSignature


def signatures(config: BartnerConfig) -> dict[str, GraphSignature]:
    layers = config.decoder_layers
    encoder = GraphSignature(
        ENCODER.inputs,
        sentence_states(layers),
        {**{name: ENCODER.axes[name] for name in ENCODER.inputs}, **sentence_state_axes(layers)},
    )
    return {
        "encoder": encoder,
        "decoder": step_graph(layers, config.decoder_heads, config.decoder_dim, config.vocabulary.first_pointer),
    }
