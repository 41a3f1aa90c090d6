"""GNER's graphs: the encoder (prompt → every decoder layer's cross-attention keys and values,
once per sentence) and the decoder's step graph with its key/value cache."""

from __future__ import annotations

from nerserve.ner.archs.gner.config import GnerConfig
from nerserve.ner.graph import GraphSignature, KeyValueCache, cross_names, step_signature

ENCODER_INPUTS = ("input_ids", "attention_mask", "shape_ids")


def decoder_cache(layers: int, heads: int, head_dim: int) -> KeyValueCache:
    return KeyValueCache(layers, heads, head_dim)


def gner_signatures(layers: int, heads: int, head_dim: int) -> dict[str, GraphSignature]:
    cross = cross_names(layers)
    cross_axes = {name: ("batch", "", "prompt", "") for name in cross}
    encoder = GraphSignature(
        ENCODER_INPUTS,
        cross,
        {
            "input_ids": ("batch", "prompt"),
            "attention_mask": ("batch", "prompt"),
            "shape_ids": ("batch", "prompt"),
            **cross_axes,
        },
    )
    step_axes = {
        "memory_mask": ("batch", "prompt"),
        "row_sentence": ("rows",),
        "tokens": ("rows",),
        "positions": ("rows",),
        "cache_order": ("rows",),
        "logits": ("rows", ""),  # the whole sub-word vocabulary, fixed per model
        **cross_axes,
    }
    step_inputs = ("memory_mask", "row_sentence", "tokens", "positions", "cache_order", *cross)
    step = step_signature(step_inputs, ("logits",), step_axes, decoder_cache(layers, heads, head_dim))
    return {"encoder": encoder, "decoder": step}


def signatures(config: GnerConfig) -> dict[str, GraphSignature]:
    return gner_signatures(config.decoder_layers, config.decoder_heads, config.head_dim)
