"""GNER's graphs: the encoder (prompt → every decoder layer's cross-attention keys and values,
once per sentence), the decoder's step graph with its key/value cache, and `rows`, which takes
rows of such per-layer tensors by index.

The step graph reads every input per row as it is fed: a loop whose rows are not the batch's
sentences in order (beam search, or some sentences only) has `rows` select their cross-attention
keys and values once per loop, and beam search reorders its cache with `rows` after each step.
A greedy loop over the whole batch, the usual case, gathers nothing at all: a gather inside the
step graph copied every layer's cache and cross keys and values at every step. The step scores
only the tokens in its `vocabulary` input: under the constraint, the few each row may write (the
projection onto all 30k sub-words read a matrix as large as the rest of the decoder at every
step). Free generation scores every token with the `scores` graph, from the step's states (its
own copy of the projection, held as a constant: gathering all of its rows as a `vocabulary`
made a step of free generation take 2.4 times as long)."""

from __future__ import annotations

from nerserve.ner.archs.gner.config import GnerConfig
from nerserve.ner.graph import GraphSignature, KeyValueCache, cross_names, step_signature

ENCODER_INPUTS = ("input_ids", "attention_mask", "shape_ids")
ROW_INDEX = "row_index"
STATES, ALL_LOGITS = "states", "all_logits"  # a step's output states; the scores graph's every-token logits


def decoder_cache(layers: int, heads: int, head_dim: int) -> KeyValueCache:
    return KeyValueCache(layers, heads, head_dim)


def row_cross_names(layers: int) -> tuple[str, ...]:
    """The step graph's cross-attention keys and values: the encoder's, one per row."""
    return tuple(f"row_{name}" for name in cross_names(layers))


def rows_names(layers: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The `rows` graph's tensors in and out: one per layer's key and per layer's value."""
    count = 2 * layers
    return tuple(f"rows_in_{i}" for i in range(count)), tuple(f"rows_out_{i}" for i in range(count))


def gner_signatures(layers: int, heads: int, head_dim: int) -> dict[str, GraphSignature]:
    cross = cross_names(layers)
    encoder = GraphSignature(
        ENCODER_INPUTS,
        cross,
        {
            "input_ids": ("batch", "prompt"),
            "attention_mask": ("batch", "prompt"),
            "shape_ids": ("batch", "prompt"),
            **{name: ("batch", "", "prompt", "") for name in cross},
        },
    )
    row_cross = row_cross_names(layers)
    step_axes = {
        "memory_mask": ("rows", "prompt"),
        "tokens": ("rows",),
        "positions": ("rows",),
        "vocabulary": ("vocabulary",),
        "logits": ("rows", "vocabulary"),
        STATES: ("rows", ""),
        **{name: ("rows", "", "prompt", "") for name in row_cross},
    }
    step = step_signature(
        ("memory_mask", "tokens", "positions", "vocabulary", *row_cross),
        ("logits", STATES),
        step_axes,
        decoder_cache(layers, heads, head_dim),
    )
    taken, selected = rows_names(layers)
    rows = GraphSignature(
        (ROW_INDEX, *taken),
        selected,
        {
            ROW_INDEX: ("rows",),
            **{name: ("sources", "", "length", "") for name in taken},
            **{name: ("rows", "", "length", "") for name in selected},
        },
    )
    scores = GraphSignature((STATES,), (ALL_LOGITS,), {STATES: ("rows", ""), ALL_LOGITS: ("rows", "")})
    return {"encoder": encoder, "decoder": step, "rows": rows, "scores": scores}


def signatures(config: GnerConfig) -> dict[str, GraphSignature]:
    return gner_signatures(config.decoder_layers, config.decoder_heads, config.head_dim)
