"""Export examples for the pointer decoder's step graph (numpy): its inputs and outputs at the
third step of 7 rows, so the cache axis holds two positions and no named axis is 0, 1 or the
size of another (torch.export specialises those)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from nerserve.ner.archs.pointer.config import PointerConfig
from nerserve.ner.archs.pointer.signatures import decoder_cache
from nerserve.ner.archs.pointer.vocabulary import START
from nerserve.ner.graph import Graph

EXAMPLE_ROWS = 7


def step_example(
    step: Graph, shared: Mapping[str, np.ndarray], lengths: Sequence[int], config: PointerConfig
) -> dict[str, np.ndarray]:
    cache = decoder_cache(config.decoder_layers, config.decoder_heads, config.decoder_dim)
    row_sentence = np.arange(EXAMPLE_ROWS, dtype=np.int64) % len(lengths)
    first_pointer = config.vocabulary.first_pointer
    feeds: dict[str, np.ndarray] = {}
    outputs: dict[str, np.ndarray] = {}
    past = cache.empty(EXAMPLE_ROWS)
    tokens = np.full(EXAMPLE_ROWS, START, dtype=np.int64)
    for position in range(3):
        feeds = {
            **shared,
            **past,
            "row_sentence": row_sentence,
            "tokens": tokens,
            "positions": np.full(EXAMPLE_ROWS, position, dtype=np.int64),
            "cache_order": np.arange(EXAMPLE_ROWS, dtype=np.int64)[::-1].copy(),
        }
        outputs = step.run(feeds)
        past = cache.carry(outputs)
        tokens = first_pointer + (np.arange(EXAMPLE_ROWS, dtype=np.int64) + position) % min(lengths)
    return {**feeds, **outputs}
