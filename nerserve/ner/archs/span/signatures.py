"""The span architecture's graphs: the shared encoder, then the span-proposal graph."""

from __future__ import annotations

from nerserve.ner.archs.feeds import ENCODER
from nerserve.ner.archs.span.config import SpanConfig
from nerserve.ner.graph import GraphSignature

SPAN_PROPOSAL = GraphSignature(
    ("word_states", "context", "word_mask", "seeds", "seed_mask", "filter_threshold"),
    ("candidates", "spans", "class_probs"),
    {
        "word_states": ("batch", "words", ""),
        "context": ("batch", ""),
        "word_mask": ("batch", "words"),
        "seeds": ("batch", "spans", ""),
        "seed_mask": ("batch", "spans"),
        "filter_threshold": ("batch",),
        "candidates": ("candidates", ""),  # (sentence, seed) of each seed the filter passes
        "spans": ("candidates", ""),
        "class_probs": ("candidates", ""),
    },
    derived_axes={"candidates": ("", 0)},  # as many as pass: a stand-in's zeros pass none
)


def signatures(config: SpanConfig) -> dict[str, GraphSignature]:
    return {"encoder": ENCODER, "span_proposal": SPAN_PROPOSAL}
