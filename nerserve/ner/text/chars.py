"""Character and word-shape features: how capitalisation reaches a model whose backbone is uncased."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import lru_cache
from typing import NamedTuple

import numpy as np

MAX_WORD_CHARS = 20  # longer words keep their first 10 and last 10 characters
PAD, UNKNOWN_UPPER, UNKNOWN_LOWER, UNKNOWN_DIGIT, UNKNOWN_OTHER = 0, 1, 2, 3, 4
_FIRST_CODEPOINT_ID = 5
CHAR_VOCAB_SIZE = _FIRST_CODEPOINT_ID + 256  # Latin-1 code points get their own id

SHAPES = ("pad", "lower", "capitalised", "upper", "mixed", "digit", "alphanumeric", "punctuation", "other")
SHAPE_VOCAB_SIZE = len(SHAPES)


def char_id(char: str) -> int:
    code = ord(char)
    if code < 256:
        return _FIRST_CODEPOINT_ID + code
    if char.isupper():
        return UNKNOWN_UPPER
    if char.islower():
        return UNKNOWN_LOWER
    if char.isdigit():
        return UNKNOWN_DIGIT
    return UNKNOWN_OTHER


def shape_id(word: str) -> int:
    if any(c.isdigit() for c in word):
        return SHAPES.index("digit") if not any(c.isalpha() for c in word) else SHAPES.index("alphanumeric")
    letters = [c for c in word if c.isalpha()]
    if not letters:
        return SHAPES.index("punctuation") if all(not c.isalnum() for c in word) else SHAPES.index("other")
    if all(c.islower() for c in letters):
        return SHAPES.index("lower")
    if all(c.isupper() for c in letters):
        return SHAPES.index("upper") if len(letters) > 1 else SHAPES.index("capitalised")
    if letters[0].isupper() and all(c.islower() for c in letters[1:]):
        return SHAPES.index("capitalised")
    return SHAPES.index("mixed")


def _clip(word: str) -> str:
    if len(word) <= MAX_WORD_CHARS:
        return word
    half = MAX_WORD_CHARS // 2
    return word[:half] + word[-half:]


# A word's character ids as the bytes of int16s: a batch's words become one array by joining
# their bytes, with no Python loop over characters.
_CHAR_DTYPE = np.dtype("<i2")


@lru_cache(maxsize=1 << 17)  # words repeat: a sentence's are mostly ones seen before
def word_features(word: str) -> tuple[bytes, int, int]:
    """A word's character ids (clipped to MAX_WORD_CHARS, int16 bytes), their count and its shape id."""
    ids = [char_id(c) for c in _clip(word)]
    return np.array(ids, dtype=_CHAR_DTYPE).tobytes(), len(ids), shape_id(word)


class CharRows(NamedTuple):
    """A sentence's character features, made once per sentence (where it is planned: an HTTP
    worker) so that a batch's are a few joins and one scatter. A named tuple of bytes, unpadded:
    it travels to the engine pickled, a few bytes a character."""

    ids: bytes  # every word's character ids in turn, int16s
    lengths: bytes  # each word's character count (at most MAX_WORD_CHARS), a byte a word
    shapes: bytes  # each word's shape id, a byte a word


def char_rows(words: Iterable[str]) -> CharRows:
    features = list(map(word_features, words))
    if not features:
        return CharRows(b"", b"", b"")
    ids, lengths, shapes = zip(*features, strict=True)
    return CharRows(b"".join(ids), bytes(lengths), bytes(shapes))


class CharFeeds(NamedTuple):
    """A batch's character inputs. `stream` [T]: the characters of every word in turn, with a 0
    before each word and one at the end, so that a convolution of width 3 sees each word as if
    it were padded on its own. `positions` [B, N, C]: where each word's characters lie in the
    stream (T where a word is shorter than C, or is padding). `shape_ids` [B, N] (0: padding).
    Convolving the stream costs its T positions; a [B, N, C] grid of characters is mostly padding
    (seven positions in eight, CoNLL-2003 test in batches of 32)."""

    stream: np.ndarray
    positions: np.ndarray
    shape_ids: np.ndarray


def encode_chars(sentences: Sequence[CharRows], n_words: int) -> CharFeeds:
    """The batch's CharFeeds, each filled in one scatter."""
    words_per_sentence = np.fromiter((len(s.shapes) for s in sentences), dtype=np.int64, count=len(sentences))
    lengths = np.frombuffer(b"".join(s.lengths for s in sentences), dtype=np.uint8).astype(np.int64)
    # the flat [B·N] slot of every word: its sentence's row, then its place within the sentence
    firsts = np.cumsum(words_per_sentence) - words_per_sentence  # each sentence's first word, flat
    places = np.arange(len(lengths)) - np.repeat(firsts, words_per_sentence)
    word_slots = np.repeat(np.arange(len(sentences)) * n_words, words_per_sentence) + places
    shape_ids = np.zeros(len(sentences) * n_words, dtype=np.int64)
    shape_ids[word_slots] = np.frombuffer(b"".join(s.shapes for s in sentences), dtype=np.uint8)
    # every character of every word: its place in the stream (one 0 before each word) and in its word
    ids = np.frombuffer(b"".join(s.ids for s in sentences), dtype=_CHAR_DTYPE)
    word_of_char = np.repeat(np.arange(len(lengths)), lengths)
    in_stream = np.arange(len(ids)) + word_of_char + 1
    stream = np.zeros(len(ids) + len(lengths) + 1, dtype=np.int64)
    stream[in_stream] = ids
    columns = np.arange(len(ids)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    width = int(lengths.max(initial=1)) or 1
    positions = np.full((len(sentences) * n_words, width), len(stream), dtype=np.int64)
    positions[word_slots[word_of_char], columns] = in_stream
    return CharFeeds(stream, positions.reshape(len(sentences), n_words, width), shape_ids.reshape(len(sentences), n_words))
