"""Words → sub-word tokens with the backbone's fast tokenizer, and the word → sub-word map.

Uses the `tokenizers` library directly (no torch, no transformers) so the service can tokenize
without the training stack. The map is a padded index tensor [B, N, P]: word i of sentence b is
made of sub-words subword_index[b, i, :subword_mask[b, i].sum()].
"""

from __future__ import annotations

from collections.abc import Sequence
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
class Tokenized:
    """A sentence's words and the sub-word ids of each word (special tokens excluded): what the
    service computes once per sentence, then windows and batches without tokenising again."""

    words: tuple[str, ...]
    pieces: tuple[tuple[int, ...], ...]

    @property
    def subwords(self) -> int:
        return sum(len(p) for p in self.pieces)

    def window(self, start: int, end: int) -> Tokenized:
        return Tokenized(self.words[start:end], self.pieces[start:end])


# A sentence as programs take it: its words, or its words already tokenised.
Words = Sequence[str] | Tokenized


def word_list(sentence: Words) -> list[str]:
    return list(sentence.words if isinstance(sentence, Tokenized) else sentence)


@dataclass(frozen=True)
class SubwordBatch:
    input_ids: np.ndarray  # [B, S] int64
    attention_mask: np.ndarray  # [B, S] int64
    subword_index: np.ndarray  # [B, N, P] int64
    subword_mask: np.ndarray  # [B, N, P] float32
    word_mask: np.ndarray  # [B, N] float32
    pieces: list[list[list[int]]]  # per sentence, per word: its sub-word positions (unpadded)

    @property
    def padded_tokens(self) -> int:
        return int(self.input_ids.shape[0] * self.input_ids.shape[1])


class SubwordEncoder:
    def __init__(self, tokenizer: Tokenizer, max_subwords: int = MAX_SUBWORDS) -> None:
        self.tokenizer = tokenizer
        self.max_subwords = max_subwords
        unk = tokenizer.model.unk_token if hasattr(tokenizer.model, "unk_token") else None
        unk_id = tokenizer.token_to_id(unk or "[UNK]")
        self.unk_id = unk_id if unk_id is not None else 0
        self.pad_id = tokenizer.token_to_id("[PAD]") or tokenizer.token_to_id("<pad>") or 0
        self.prefix, self.suffix = _special_template(tokenizer)

    @property
    def special_count(self) -> int:
        """Special tokens the tokenizer's template adds around a sentence ([CLS] … [SEP]: 2)."""
        return len(self.prefix) + len(self.suffix)

    def tokenize(self, sentences: Sequence[Sequence[str]]) -> list[Tokenized]:
        """Each word's sub-word ids. A word the tokenizer drops entirely (e.g. a lone zero-width
        character) would have no vector: it becomes the unknown token."""
        encodings = self.tokenizer.encode_batch([list(s) for s in sentences], is_pretokenized=True, add_special_tokens=False)
        tokenized = []
        for words, encoding in zip(sentences, encodings, strict=True):
            pieces: list[list[int]] = [[] for _ in words]
            for token, word in zip(encoding.ids, encoding.word_ids, strict=True):
                if word is not None:
                    pieces[word].append(token)
            tokenized.append(Tokenized(tuple(words), tuple(tuple(p) if p else (self.unk_id,) for p in pieces)))
        return tokenized

    def encode(self, sentences: Sequence[Words]) -> SubwordBatch:
        plain = [s for s in sentences if not isinstance(s, Tokenized)]
        fresh = iter(self.tokenize(plain))
        ready = [s if isinstance(s, Tokenized) else next(fresh) for s in sentences]
        ids: list[list[int]] = []
        maps: list[list[list[int]]] = []
        for index, sentence in enumerate(ready):
            row, positions = list(self.prefix), []
            for piece in sentence.pieces:
                positions.append(list(range(len(row), len(row) + len(piece))))
                row.extend(piece)
            row.extend(self.suffix)
            if len(row) > self.max_subwords:
                raise SentenceTooLong(f"sentence {index} has {len(row)} sub-words (limit {self.max_subwords})")
            ids.append(row)
            maps.append(positions)
        batch = len(ready)
        seq = max(len(row) for row in ids)
        n_words = max(len(s.words) for s in ready)
        per_word = max(len(p) for pieces in maps for p in pieces)
        input_ids = np.full((batch, seq), self.pad_id, dtype=np.int64)
        attention_mask = np.zeros((batch, seq), dtype=np.int64)
        subword_index = np.zeros((batch, n_words, per_word), dtype=np.int64)
        subword_mask = np.zeros((batch, n_words, per_word), dtype=np.float32)
        word_mask = np.zeros((batch, n_words), dtype=np.float32)
        for b, (row, positions) in enumerate(zip(ids, maps, strict=True)):
            input_ids[b, : len(row)] = row
            attention_mask[b, : len(row)] = 1
            word_mask[b, : len(positions)] = 1
            for i, word_positions in enumerate(positions):
                subword_index[b, i, : len(word_positions)] = word_positions
                subword_mask[b, i, : len(word_positions)] = 1
        return SubwordBatch(input_ids, attention_mask, subword_index, subword_mask, word_mask, maps)


def _special_template(tokenizer: Tokenizer) -> tuple[list[int], list[int]]:
    """The ids the tokenizer's post-processor puts before and after a single sentence, found by
    encoding one word with and without them (BERT: [CLS] / [SEP]; T5: none / </s>)."""
    bare = tokenizer.encode(["a"], is_pretokenized=True, add_special_tokens=False).ids
    full = tokenizer.encode(["a"], is_pretokenized=True).ids
    for start in range(len(full) - len(bare) + 1):
        if full[start : start + len(bare)] == bare:
            return full[:start], full[start + len(bare) :]
    raise ValueError("cannot find the sentence inside the tokenizer's special-token template")
