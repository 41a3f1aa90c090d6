"""The shared word encoder's graph signature and feeds (numpy; every architecture's program
starts with these)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from nerserve.ner.graph import GraphSignature
from nerserve.ner.text.chars import CharFeeds, encode_chars
from nerserve.ner.text.subword import SubwordBatch, SubwordEncoder, Words, sentence_char_rows

# Packed rows in (ner.text.subword), one row per sentence out: "rows" × "row_subwords" are the
# backbone's positions, "batch" × "subwords" each sentence's own.
ENCODER_INPUTS = (
    "input_ids",
    "segment_ids",
    "position_ids",
    "token_index",
    "subword_index",
    "subword_mask",
    "char_stream",
    "char_index",
    "shape_ids",
    "word_mask",
)
# Named dynamic axes of every input and output ("" marks a fixed axis).
ENCODER_AXES: dict[str, tuple[str, ...]] = {
    "input_ids": ("rows", "row_subwords"),
    "segment_ids": ("rows", "row_subwords"),
    "position_ids": ("rows", "row_subwords"),
    "token_index": ("batch", "subwords"),
    "subword_index": ("batch", "words", "pieces"),
    "subword_mask": ("batch", "words", "pieces"),
    "char_stream": ("char_stream",),
    "char_index": ("batch", "words", "chars"),
    "shape_ids": ("batch", "words"),
    "word_mask": ("batch", "words"),
    "word_states": ("batch", "words", ""),
    "context": ("batch", ""),
}
ENCODER = GraphSignature(ENCODER_INPUTS, ("word_states", "context"), ENCODER_AXES)


def encoder_feeds(subwords: SubwordEncoder, sentences: Sequence[Words]) -> tuple[dict[str, np.ndarray], SubwordBatch]:
    """ENCODER_INPUTS by name, and the sub-word batch they came from."""
    encoded = subwords.encode(sentences)
    chars = encode_chars(list(map(sentence_char_rows, sentences)), encoded.word_mask.shape[1])
    return {**subword_feeds(encoded), **char_feeds(chars), "word_mask": encoded.word_mask}, encoded


def char_feeds(chars: CharFeeds) -> dict[str, np.ndarray]:
    """The encoder inputs that come from the characters (`char_index`: their positions)."""
    return {"char_stream": chars.stream, "char_index": chars.positions, "shape_ids": chars.shape_ids}


def subword_feeds(encoded: SubwordBatch) -> dict[str, np.ndarray]:
    """The packed rows and the word map: the encoder inputs that come from the sub-words."""
    return {
        "input_ids": encoded.input_ids,
        "segment_ids": encoded.segment_ids,
        "position_ids": encoded.position_ids,
        "token_index": encoded.token_index,
        "subword_index": encoded.subword_index,
        "subword_mask": encoded.subword_mask,
    }
