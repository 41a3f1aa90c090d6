"""NAG-NER's graphs: encoder + entity-start classifier, then one parallel decoder pass over all
queries (a query = one entity to write: sentence, start word, start sub-word position, rank n)."""

from __future__ import annotations

from nerserve.ner.archs.feeds import ENCODER
from nerserve.ner.archs.nag.config import NagConfig
from nerserve.ner.graph import GraphSignature

ENCODER_WITH_STARTS = GraphSignature(
    (*ENCODER.inputs, "subword_words", "memory_mask"),
    ("start_probs", "memory", "word_queries"),
    {
        **{name: ENCODER.axes[name] for name in ENCODER.inputs},
        "subword_words": ("batch", "subwords"),
        "memory_mask": ("batch", "subwords"),
        "start_probs": ("batch", "words", ""),
        "memory": ("batch", "subwords", ""),
        "word_queries": ("batch", "words", ""),
    },
)
DECODER = GraphSignature(
    ("memory", "memory_mask", "word_queries", "query_sentence", "query_word", "query_position", "query_rank"),
    ("token_ids", "token_probs"),
    {
        "memory": ("batch", "subwords", ""),
        "memory_mask": ("batch", "subwords"),
        "word_queries": ("batch", "words", ""),
        "query_sentence": ("queries",),
        "query_word": ("queries",),
        "query_position": ("queries",),
        "query_rank": ("queries",),
        "token_ids": ("queries", ""),
        "token_probs": ("queries", ""),
    },
)


def signatures(config: NagConfig) -> dict[str, GraphSignature]:
    return {"encoder": ENCODER_WITH_STARTS, "decoder": DECODER}
