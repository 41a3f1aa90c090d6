"""The span architecture's graphs: the shared encoder, then the span-proposal graph."""

from __future__ import annotations

from nerserve.ner.archs.feeds import ENCODER
from nerserve.ner.archs.span.config import SpanConfig
from nerserve.ner.graph import GraphSignature

SPAN_PROPOSAL = GraphSignature(
    ("word_states", "context", "word_mask", "seeds", "seed_mask", "filter_threshold"),
    ("filter_prob", "offsets", "spans", "class_probs"),
    {
        "word_states": ("batch", "words", ""),
        "context": ("batch", ""),
        "word_mask": ("batch", "words"),
        "seeds": ("batch", "spans", ""),
        "seed_mask": ("batch", "spans"),
        "filter_threshold": ("batch",),
        "filter_prob": ("batch", "spans"),
        "offsets": ("batch", "spans", ""),
        "spans": ("batch", "spans", ""),
        "class_probs": ("batch", "spans", ""),
    },
)


def signatures(config: SpanConfig) -> dict[str, GraphSignature]:
    return {"encoder": ENCODER, "span_proposal": SPAN_PROPOSAL}
