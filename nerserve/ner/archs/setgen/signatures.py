"""SetGNER's graphs: the shared encoder with the head/in-entity/tail detector and the occurrence
count head (plus the decoder's memory and pointer keys, computed once per sentence), then the
pointer decoder's step graph with its key/value cache."""

from __future__ import annotations

from nerserve.ner.archs.feeds import ENCODER
from nerserve.ner.archs.pointer.signatures import step_graph
from nerserve.ner.archs.setgen.config import SetgenConfig
from nerserve.ner.graph import GraphSignature

ENCODER_WITH_DETECTORS = GraphSignature(
    ENCODER.inputs,
    ("part_probs", "count_probs", "memory", "pointer_keys"),
    {
        **{name: ENCODER.axes[name] for name in ENCODER.inputs},
        "part_probs": ("batch", "words", ""),
        "count_probs": ("batch", "words", ""),
        "memory": ("batch", "words", ""),
        "pointer_keys": ("batch", "words", ""),
    },
)


def signatures(config: SetgenConfig) -> dict[str, GraphSignature]:
    return {
        "encoder": ENCODER_WITH_DETECTORS,
        "decoder": step_graph(config.decoder_layers, config.decoder_heads, config.decoder_dim, config.vocabulary.first_pointer),
    }
