"""SetGNER's graphs: the shared encoder with the head/in-entity/tail detector and the occurrence
count head (plus what the pointer decoder reads of a sentence, computed once per sentence), then
the pointer decoder's step graph with its key/value cache."""

from __future__ import annotations

from nerserve.ner.archs.feeds import ENCODER
from nerserve.ner.archs.pointer.signatures import sentence_state_axes, sentence_states, step_graph
from nerserve.ner.archs.setgen.config import SetgenConfig
from nerserve.ner.graph import GraphSignature


def signatures(config: SetgenConfig) -> dict[str, GraphSignature]:
    layers = config.decoder_layers
    encoder = GraphSignature(
        ENCODER.inputs,
        ("part_probs", "count_probs", *sentence_states(layers)),
        {
            **{name: ENCODER.axes[name] for name in ENCODER.inputs},
            "part_probs": ("batch", "words", ""),
            "count_probs": ("batch", "words", ""),
            **sentence_state_axes(layers),
        },
    )
    return {
        "encoder": encoder,
        "decoder": step_graph(layers, config.decoder_heads, config.decoder_dim, config.vocabulary.first_pointer),
    }
