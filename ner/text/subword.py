"""Words → sub-word tokens with the backbone's fast tokenizer, and the word → sub-word map.

Uses the `tokenizers` library directly (no torch, no transformers) so the service can tokenize
without the training stack. The map is a padded index tensor [B, N, P]: word i of sentence b is
made of sub-words subword_index[b, i, :subword_mask[b, i].sum()].
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

MAX_SUBWORDS = 512


class SentenceTooLong(ValueError):
    """A sentence needs more sub-words than the backbone's positions allow; callers window it."""


def load_tokenizer(folder: Path) -> Tokenizer:
    """The fast tokenizer of a Hugging Face model folder (tokenizer.json), with the truncation
    and padding some folders ship disabled: we pad ourselves and never truncate silently."""
    path = folder / "tokenizer.json"
    if path.is_file():
        tokenizer = Tokenizer.from_file(str(path))
    else:  # older folders ship only vocab files: let transformers build the fast tokenizer once
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(folder), use_fast=True).backend_tokenizer
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return tokenizer


@dataclass(frozen=True)
class SubwordBatch:
    input_ids: np.ndarray  # [B, S] int64
    attention_mask: np.ndarray  # [B, S] int64
    subword_index: np.ndarray  # [B, N, P] int64
    subword_mask: np.ndarray  # [B, N, P] float32
    word_mask: np.ndarray  # [B, N] float32
    n_subwords: list[int]
    pieces: list[list[list[int]]]  # per sentence, per word: its sub-word positions (unpadded)

    @property
    def padded_tokens(self) -> int:
        return int(self.input_ids.shape[0] * self.input_ids.shape[1])


class SubwordEncoder:
    def __init__(self, tokenizer: Tokenizer, max_subwords: int = MAX_SUBWORDS) -> None:
        self.tokenizer = tokenizer
        self.max_subwords = max_subwords
        unk = tokenizer.model.unk_token if hasattr(tokenizer.model, "unk_token") else None
        self.unk_token = unk or "[UNK]"
        self.pad_id = tokenizer.token_to_id("[PAD]") or tokenizer.token_to_id("<pad>") or 0

    def count(self, words: list[str]) -> int:
        """Sub-words a sentence needs, specials included (for windowing and batching budgets)."""
        return len(self.tokenizer.encode(words, is_pretokenized=True).ids)

    def encode(self, sentences: list[list[str]]) -> SubwordBatch:
        encodings = self.tokenizer.encode_batch(sentences, is_pretokenized=True)
        maps: list[list[list[int]]] = []
        for index, (words, encoding) in enumerate(zip(sentences, encodings, strict=True)):
            pieces = _word_pieces(encoding.word_ids, len(words))
            if any(not p for p in pieces):
                # A word the tokenizer drops entirely (e.g. a lone zero-width character) would
                # have no vector: re-encode with such words replaced by the unknown token.
                words = [w if p else self.unk_token for w, p in zip(words, pieces, strict=True)]
                encoding = self.tokenizer.encode(words, is_pretokenized=True)
                encodings[index] = encoding
                pieces = _word_pieces(encoding.word_ids, len(words))
            if len(encoding.ids) > self.max_subwords:
                raise SentenceTooLong(f"sentence {index} has {len(encoding.ids)} sub-words (limit {self.max_subwords})")
            maps.append(pieces)
        batch = len(sentences)
        seq = max(len(e.ids) for e in encodings)
        n_words = max(len(words) for words in sentences)
        per_word = max(len(p) for pieces in maps for p in pieces)
        input_ids = np.full((batch, seq), self.pad_id, dtype=np.int64)
        attention_mask = np.zeros((batch, seq), dtype=np.int64)
        subword_index = np.zeros((batch, n_words, per_word), dtype=np.int64)
        subword_mask = np.zeros((batch, n_words, per_word), dtype=np.float32)
        word_mask = np.zeros((batch, n_words), dtype=np.float32)
        for b, (encoding, pieces) in enumerate(zip(encodings, maps, strict=True)):
            input_ids[b, : len(encoding.ids)] = encoding.ids
            attention_mask[b, : len(encoding.ids)] = 1
            word_mask[b, : len(pieces)] = 1
            for i, piece in enumerate(pieces):
                subword_index[b, i, : len(piece)] = piece
                subword_mask[b, i, : len(piece)] = 1
        return SubwordBatch(
            input_ids, attention_mask, subword_index, subword_mask, word_mask, [len(e.ids) for e in encodings], maps
        )


def _word_pieces(word_ids: list[int | None], n_words: int) -> list[list[int]]:
    pieces: list[list[int]] = [[] for _ in range(n_words)]
    for position, word in enumerate(word_ids):
        if word is not None:
            pieces[word].append(position)
    return pieces
