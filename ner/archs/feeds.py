"""The shared word encoder's graph feeds for a batch of sentences (numpy; every architecture's
program starts with these)."""

from __future__ import annotations

import numpy as np

from ner.text.chars import encode_chars
from ner.text.subword import SubwordBatch, SubwordEncoder


def encoder_feeds(subwords: SubwordEncoder, sentences: list[list[str]]) -> tuple[dict[str, np.ndarray], SubwordBatch]:
    """ENCODER_INPUTS by name, and the sub-word batch they came from."""
    encoded = subwords.encode(sentences)
    char_ids, shape_ids = encode_chars(sentences, encoded.word_mask.shape[1])
    feeds = {
        "input_ids": encoded.input_ids,
        "attention_mask": encoded.attention_mask,
        "subword_index": encoded.subword_index,
        "subword_mask": encoded.subword_mask,
        "char_ids": char_ids,
        "shape_ids": shape_ids,
        "word_mask": encoded.word_mask,
    }
    return feeds, encoded
