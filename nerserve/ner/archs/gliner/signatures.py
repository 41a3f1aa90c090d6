"""The label-matching architecture's one graph: prompt and sentence through the encoder, every
candidate span scored against every label of the prompt."""

from __future__ import annotations

from nerserve.ner.archs.feeds import ENCODER_AXES, ENCODER_INPUTS
from nerserve.ner.archs.gliner.config import GlinerConfig
from nerserve.ner.graph import GraphSignature

MATCH_INPUTS = (*ENCODER_INPUTS, "text_index", "label_index", "spans", "span_slots")
MATCHER = GraphSignature(
    MATCH_INPUTS,
    ("scores",),
    {
        **ENCODER_AXES,
        # the prompt's words (marker, name, …, separator) come before the sentence's words
        "subword_index": ("batch", "prompt_words", "pieces"),
        "subword_mask": ("batch", "prompt_words", "pieces"),
        "text_index": ("batch", "words"),
        "label_index": ("batch", "labels"),
        # the spans scored, packed across rows (row, first word, end), and where each row's go
        "spans": ("scored_spans", ""),
        "span_slots": ("batch", "spans"),
        "scores": ("batch", "spans", "labels"),
    },
)


def signatures(config: GlinerConfig) -> dict[str, GraphSignature]:
    return {"encoder": MATCHER}
