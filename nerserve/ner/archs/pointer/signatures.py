"""The pointer decoder's step graph signature, from the decoder's size in the config."""

from __future__ import annotations

from nerserve.ner.graph import GraphSignature, KeyValueCache, step_signature


def decoder_cache(layers: int, heads: int, dim: int) -> KeyValueCache:
    return KeyValueCache(layers, heads, dim // heads)


def step_graph(layers: int, heads: int, dim: int, first_pointer: int) -> GraphSignature:
    """FIRST_POINTER: the tokens before the word pointers in the output vocabulary (specials, types)."""
    axes = {
        "memory": ("batch", "words", ""),
        "memory_mask": ("batch", "words"),
        "pointer_keys": ("batch", "words", ""),
        "row_sentence": ("rows",),
        "tokens": ("rows",),
        "positions": ("rows",),
        "cache_order": ("rows",),
        "logits": ("rows", "vocabulary"),
    }
    inputs = ("memory", "memory_mask", "pointer_keys", "row_sentence", "tokens", "positions", "cache_order")
    vocabulary = {"vocabulary": ("words", first_pointer)}
    return step_signature(inputs, ("logits",), axes, decoder_cache(layers, heads, dim), vocabulary)
