"""The pointer decoder's graph signatures, from the decoder's size in the config: what the
encoder graph adds for it (once per sentence) and its step graph."""

from __future__ import annotations

from nerserve.ner.graph import GraphSignature, KeyValueCache, cross_names, step_signature


def decoder_cache(layers: int, heads: int, dim: int) -> KeyValueCache:
    return KeyValueCache(layers, heads, dim // heads)


def sentence_states(layers: int) -> tuple[str, ...]:
    """The encoder graph's outputs that only the decoder steps read (kept on the device between
    them): the memory, the pointer keys, every layer's cross-attention keys and values."""
    return ("memory", "pointer_keys", *cross_names(layers))


def sentence_state_axes(layers: int) -> dict[str, tuple[str, ...]]:
    return {
        "memory": ("batch", "words", ""),
        "pointer_keys": ("batch", "words", ""),
        **{name: ("batch", "", "words", "") for name in cross_names(layers)},
    }


def step_graph(layers: int, heads: int, dim: int, first_pointer: int) -> GraphSignature:
    """FIRST_POINTER: the tokens before the word pointers in the output vocabulary (specials, types)."""
    axes = {
        **sentence_state_axes(layers),
        "memory_mask": ("batch", "words"),
        "row_sentence": ("rows",),
        "tokens": ("rows",),
        "positions": ("rows",),
        "cache_order": ("rows",),
        "logits": ("rows", "vocabulary"),
    }
    inputs = (
        "memory",
        "memory_mask",
        "pointer_keys",
        "row_sentence",
        "tokens",
        "positions",
        "cache_order",
        *cross_names(layers),
    )
    vocabulary = {"vocabulary": ("words", first_pointer)}
    return step_signature(inputs, ("logits",), axes, decoder_cache(layers, heads, dim), vocabulary)
