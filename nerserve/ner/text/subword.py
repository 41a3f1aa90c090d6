"""Words → sub-word tokens with the backbone's fast tokenizer, packed into encoder rows, and the
word → sub-word map.

Uses the `tokenizers` library directly (no torch, no transformers) so the service can tokenize
without the training stack.

Packing instead of padding: several sentences share one row of the encoder (first-fit decreasing
into rows of the length that costs least, packed_rows), each row position carries its sentence's number within the row
(`segment_ids`, 0 for padding) and its position within that sentence (`position_ids`). The
encoder lets a position attend only within its own segment, so a sentence's vectors are those it
would get alone in a row; on CPU a padded batch of CoNLL sentences costs more a sentence than
sentences run one at a time, a packed one less than half (docs/decisions/packing.md).
`token_index` [B, T] takes the packed rows back to one row per sentence (position t of sentence b
sits at flat position token_index[b, t] of the rows), in which the word map is expressed: word i
of sentence b is made of sentence positions subword_index[b, i, :subword_mask[b, i].sum()] (its
other slots repeat its first sub-word, so a max over all of them needs no mask).
"""

from __future__ import annotations

import itertools
import json
import unicodedata
from array import array
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from nerserve.ner.text.chars import CharRows, char_rows

MAX_SUBWORDS = 512
# The longest encoder row packing makes (a longer sentence gets a row of its own length). Each
# batch takes the row length up to it that costs least (packed_rows): attention's work grows with
# a row's length, the rest does not, so long rows cost more a position and short ones pad more.
ROW_SUBWORDS = 256
# Attention's extra cost a position per position of its row, relative to a position's other work
# (measured on MiniLM-L6: docs/decisions/packing.md).
ATTENTION_COST_PER_POSITION = 1 / 700
# The same for a backbone whose position-wise layers skip the rows' padding (ner.unpadded: the ONNX
# encoders), where a padded position costs attention alone, so shorter rows pay (measured, ibid.).
UNPADDED_ATTENTION_COST_PER_POSITION = 1 / 150


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
    service computes once per sentence, then windows and batches without tokenising again. The ids
    are kept as machine words, flat, with each word's count: a batch joins its sentences' bytes and
    reads them as one array, and an HTTP worker sends them to the engine as they are."""

    words: tuple[str, ...]
    ids: bytes  # every word's sub-word ids in turn, SUBWORD_ID
    counts: bytes  # each word's number of sub-words, PIECE_COUNT

    @classmethod
    def of(cls, words: Sequence[str], pieces: Sequence[Sequence[int]]) -> Tokenized:
        """From each word's sub-word ids."""
        return cls(
            tuple(words),
            array(SUBWORD_ID, itertools.chain.from_iterable(pieces)).tobytes(),
            array(PIECE_COUNT, map(len, pieces)).tobytes(),
        )

    @property
    def subwords(self) -> int:
        return len(self.ids) // ID_SIZE

    @property
    def piece_counts(self) -> list[int]:
        return array(PIECE_COUNT, self.counts).tolist()

    @cached_property
    def pieces(self) -> tuple[tuple[int, ...], ...]:
        """Each word's sub-word ids."""
        ids = array(SUBWORD_ID, self.ids).tolist()
        ends = itertools.accumulate(self.piece_counts)
        return tuple(tuple(ids[end - count : end]) for end, count in zip(ends, self.piece_counts, strict=True))

    @cached_property
    def char_rows(self) -> CharRows:
        """Its words' character features: made where it is planned, so the engine only joins them."""
        return char_rows(self.words)

    def __reduce__(self) -> tuple[Callable[..., Tokenized], tuple[Any, ...]]:
        # pickled as its bytes (an HTTP worker sends every sentence it planned to the engine), with
        # its character features' bytes when they were made (in line: a named tuple of its own cost
        # the engine's unpickling another object made through its class)
        return (_tokenized, (self.words, self.ids, self.counts, *self.__dict__.get("char_rows", ())))

    def window(self, start: int, end: int) -> Tokenized:
        if start == 0 and end == len(self.words):
            return self  # the whole sentence, as nearly every window is: no copy
        firsts = [0, *itertools.accumulate(self.piece_counts)]
        return Tokenized(
            self.words[start:end],
            self.ids[firsts[start] * ID_SIZE : firsts[end] * ID_SIZE],
            self.counts[start * COUNT_SIZE : end * COUNT_SIZE],
        )

    def followed_by(self, other: Tokenized) -> Tokenized:
        """This sentence's words, then OTHER's, as one sentence."""
        return Tokenized(self.words + other.words, self.ids + other.ids, self.counts + other.counts)


SUBWORD_ID, PIECE_COUNT = "i", "I"  # array typecodes: 32-bit, signed and unsigned
ID_SIZE, COUNT_SIZE = array(SUBWORD_ID).itemsize, array(PIECE_COUNT).itemsize
SUBWORD_DTYPE, COUNT_DTYPE = np.dtype(np.int32), np.dtype(np.uint32)


def _tokenized(words: tuple[str, ...], ids: bytes, counts: bytes, *rows: bytes) -> Tokenized:
    # made as unpickling makes a dataclass by default, its fields put in place without __init__ (a
    # frozen one's sets each field through object.__setattr__: a fifth of an engine's unpickling)
    sentence = object.__new__(Tokenized)
    sentence.__dict__.update(words=words, ids=ids, counts=counts)
    if rows:
        sentence.__dict__["char_rows"] = tuple.__new__(CharRows, rows)  # what cached_property would have stored
    return sentence


# a word's sub-word ids and their count, as Tokenized keeps them: a sentence is its words' joined
WordBytes = tuple[bytes, bytes]


def _word_bytes(ids: Sequence[int]) -> WordBytes:
    return array(SUBWORD_ID, ids).tobytes(), array(PIECE_COUNT, [len(ids)]).tobytes()


def _joined(words: Sequence[str], parts: list[WordBytes]) -> Tokenized:
    return Tokenized(tuple(words), b"".join([ids for ids, _ in parts]), b"".join([count for _, count in parts]))


# A sentence as programs take it: its words, or its words already tokenised.
Words = Sequence[str] | Tokenized


def word_count(sentence: Words) -> int:
    return len(sentence.words) if isinstance(sentence, Tokenized) else len(sentence)


def sentence_char_rows(sentence: Words) -> CharRows:
    return sentence.char_rows if isinstance(sentence, Tokenized) else char_rows(sentence)


@dataclass(frozen=True)
class SubwordBatch:
    input_ids: np.ndarray  # [R, S] int64: packed rows
    segment_ids: np.ndarray  # [R, S] int64: 1, 2, … for a row's sentences, 0 for padding
    position_ids: np.ndarray  # [R, S] int64: position within its own sentence
    token_index: np.ndarray  # [B, T] int64: flat row position of each sentence position
    subword_index: np.ndarray  # [B, N, P] int64: sentence positions of each word's sub-words
    subword_mask: np.ndarray  # [B, N, P] float32
    word_mask: np.ndarray  # [B, N] float32
    word_counts: list[int]  # words of each sentence
    piece_lengths: np.ndarray  # [words] int64: sub-words of each word, all sentences' words in turn
    first_position: int  # where a sentence's first word starts (after the template's prefix)
    token_counts: list[int]  # sub-words of each sentence, specials included

    @cached_property
    def pieces(self) -> list[list[list[int]]]:
        """Per sentence, per word: its sub-word positions (unpadded); made when asked for."""
        return [self.sentence_pieces(b) for b in range(len(self.word_counts))]

    @cached_property
    def word_firsts(self) -> list[int]:
        """Where each sentence's words start among all the batch's words."""
        return list(itertools.accumulate(self.word_counts[:-1], initial=0))

    def sentence_pieces(self, sentence: int) -> list[list[int]]:
        """Per word of one sentence: its sub-word positions (a decoder that needs only some
        sentences' asks for those)."""
        first = self.word_firsts[sentence]
        lengths = self.piece_lengths[first : first + self.word_counts[sentence]].tolist()
        starts = itertools.accumulate(lengths, initial=self.first_position)  # one more than the words
        return [list(range(start, start + length)) for start, length in zip(starts, lengths, strict=False)]

    @property
    def padded_tokens(self) -> int:
        """Sub-word positions the encoder computes: rows × row length, padding included."""
        return int(self.input_ids.shape[0] * self.input_ids.shape[1])

    @property
    def sentence_positions(self) -> tuple[int, int]:
        """(B, T): the shape of the per-sentence sub-word layout the encoder's outputs use."""
        return int(self.token_index.shape[0]), int(self.token_index.shape[1])


def pack_rows(lengths: Sequence[int], row_subwords: int, order: Sequence[int] | None = None) -> list[list[int]]:
    """Sentence indices per row, first-fit decreasing into rows of max(row_subwords, longest)
    positions; row_subwords 0 puts every sentence in a row of its own (no packing). Deterministic:
    ties keep the input order. `order`: the indices longest first, when the caller has them."""
    if row_subwords <= 0:
        return [[i] for i in range(len(lengths))]
    capacity = max(row_subwords, max(lengths, default=0))
    shortest = min(lengths, default=0)
    rows: list[list[int]] = []
    free: list[int] = []
    first_open = 0  # rows before it have no room even for the shortest sentence
    for i in order if order is not None else longest_first(lengths):
        length = lengths[i]
        for row in range(first_open, len(free)):
            if free[row] >= length:
                break
        else:
            row = len(rows)
            rows.append([])
            free.append(capacity)
        rows[row].append(i)
        free[row] -= length
        while first_open < len(free) and free[first_open] < shortest:
            first_open += 1
    return rows


def longest_first(lengths: Sequence[int]) -> list[int]:
    # a stable sort keeps equal lengths in input order, reversed or not
    return sorted(range(len(lengths)), key=lengths.__getitem__, reverse=True)


def packing_cost(lengths: Sequence[int], rows: list[list[int]], attention: float = ATTENTION_COST_PER_POSITION) -> float:
    """The encoder's work for these rows, in positions of a row of one: rows × row length, each
    position dearer by attention over the row's length (`attention` a position per position)."""
    return float(row_cost(len(rows), max(sum(lengths[i] for i in row) for row in rows), attention))


def row_cost(
    rows: int | np.ndarray, length: int | np.ndarray, attention: float = ATTENTION_COST_PER_POSITION
) -> float | np.ndarray:
    """`rows` rows of `length` positions, in positions of a row of one (numbers or numpy arrays)."""
    return rows * length * (1 + length * attention)


def packed_rows(lengths: Sequence[int], longest_row: int, attention: float = ATTENTION_COST_PER_POSITION) -> list[list[int]]:
    """The cheapest packing (packing_cost with `attention`) among rows of the longest sentence's
    length up to `longest_row` sub-words, in steps of 16; longest_row 0: a sentence a row."""
    if longest_row <= 0 or not lengths:
        return pack_rows(lengths, 0)
    longest, total = max(lengths), sum(lengths)
    order = longest_first(lengths)
    runs = sorted(Counter(lengths).items(), reverse=True)
    best_cost, best = float("inf"), (0, list[tuple[int, int]]())
    for capacity in (longest, *range(longest - longest % 16 + 16, longest_row + 1, 16)):
        # the first row takes everything, or is left with less room than the longest sentence: a
        # floor that only rises with the row length, so no longer row can do better either
        if fill_floor(total, min(total, capacity - longest + 1), attention) >= best_cost:
            break
        if cost_floor(runs, total, capacity, first_row_fill(runs, capacity), attention) >= best_cost:
            continue  # it cannot cost less: no need to pack it
        free, placements = first_fit_runs(runs, capacity)
        cost = float(row_cost(len(free), capacity - min(free), attention))
        if cost < best_cost:  # the first of equal costs, as the narrowest rows
            best_cost, best = cost, (len(free), placements)
    row_count, placements = best
    rows: list[list[int]] = [[] for _ in range(row_count)]
    position = 0
    for row, taken in placements:
        rows[row].extend(order[position : position + taken])
        position += taken
    return rows


def fill_floor(total: int, fullest: int, attention: float) -> float:
    """A floor under packing_cost when some row holds `fullest` positions: the rows times the longest
    row cover every position, and each position costs attention over at least `fullest`."""
    return total * (1 + fullest * attention)


def cost_floor(runs: list[tuple[int, int]], total: int, capacity: int, fullest: int, attention: float) -> float:
    """fill_floor, raised where the rows must be more than `total` positions: there are at least
    total ÷ capacity of them, and one for each sentence longer than half a row (no two share a row),
    each as long as the longest (`fullest` at least)."""
    rows = max(-(-total // capacity), sum(count for length, count in runs if 2 * length > capacity))
    return fill_floor(max(total, rows * fullest), fullest, attention)


def first_row_fill(runs: list[tuple[int, int]], capacity: int) -> int:
    """The positions first_fit_runs puts in its first row, without the other rows: of each run (longest
    first) as many sentences as still fit."""
    free = capacity
    for length, count in runs:
        if 0 < length <= free:
            free -= length * min(count, free // length)
    return capacity - free


def first_fit_runs(runs: list[tuple[int, int]], capacity: int) -> tuple[list[int], list[tuple[int, int]]]:
    """First-fit decreasing of runs of equal lengths (longest first): each row's free room, and
    (row, sentences) in sentence order. A run's sentences fill the first row with room, as many as
    fit, then the next, then new rows: what placing them one at a time gives, with a step per row,
    not per sentence."""
    free: list[int] = []
    placements: list[tuple[int, int]] = []
    first_open, shortest = 0, runs[-1][0]  # rows before first_open have no room even for the shortest
    for length, count in runs:
        if not length:  # empty sentences fit anywhere
            if first_open < len(free):
                placements.append((first_open, count))
                count = 0
        else:
            for row in [r for r in range(first_open, len(free)) if free[r] >= length]:
                taken = min(free[row] // length, count)
                free[row] -= taken * length
                placements.append((row, taken))
                count -= taken
                if not count:
                    break
        while count:
            taken = min(capacity // length, count) if length else count
            free.append(capacity - taken * length)
            placements.append((len(free) - 1, taken))
            count -= taken
        while first_open < len(free) and free[first_open] < shortest:
            first_open += 1
    return free, placements


class SubwordEncoder:
    def __init__(
        self,
        tokenizer: Tokenizer,
        max_subwords: int = MAX_SUBWORDS,
        row_subwords: int = ROW_SUBWORDS,
        attention_cost: float = ATTENTION_COST_PER_POSITION,
    ) -> None:
        self.tokenizer = tokenizer
        self.max_subwords = max_subwords
        self.row_subwords = row_subwords  # the longest packed row; 0: one sentence a row
        self.attention_cost = attention_cost  # what packing weighs a row's length by (packed_rows)
        unk = tokenizer.model.unk_token if hasattr(tokenizer.model, "unk_token") else None
        unk_id = tokenizer.token_to_id(unk or "[UNK]")
        self.unk_id = unk_id if unk_id is not None else 0
        self.pad_id = tokenizer.token_to_id("[PAD]") or tokenizer.token_to_id("<pad>") or 0
        self.prefix, self.suffix = _special_template(tokenizer)
        # each word's sub-words (WordBytes), when the tokenizer splits words independently of their neighbours
        self.word_pieces: dict[str, WordBytes] | None = {} if words_are_independent(tokenizer) else None

    @property
    def special_count(self) -> int:
        """Special tokens the tokenizer's template adds around a sentence ([CLS] … [SEP]: 2)."""
        return len(self.prefix) + len(self.suffix)

    def tokenize(self, sentences: Sequence[Sequence[str]]) -> list[Tokenized]:
        """Each word's sub-word ids. A word the tokenizer drops entirely (e.g. a lone zero-width
        character) would have no vector: it becomes the unknown token. Words repeat, so where the
        tokenizer reads each word alone, only words not seen before are tokenised."""
        cache = self.word_pieces
        if cache is None:
            return self.tokenize_sentences(sentences)
        try:  # a server's batches are mostly words seen before: one lookup a word, no search for new ones
            return [_joined(words, list(map(cache.__getitem__, words))) for words in sentences]
        except KeyError:
            pass
        unseen = list({word: None for words in sentences for word in words if word not in cache})
        if unseen:
            if len(cache) + len(unseen) > WORD_CACHE_SIZE:
                # a new dict rather than clear(): another thread may be reading the old one
                cache = self.word_pieces = {}
            pieces = self._fewer_unknowns(unseen, [ids or (self.unk_id,) for ids in self._encode_alone(unseen)])
            cache.update((word, _word_bytes(ids)) for word, ids in zip(unseen, pieces, strict=True))
        return [_joined(words, [cache[w] for w in words]) for words in sentences]

    def _encode_alone(self, words: Sequence[str]) -> list[tuple[int, ...]]:
        """Each word's sub-word ids, the word tokenised on its own."""
        encodings = self.tokenizer.encode_batch([[w] for w in words], is_pretokenized=True, add_special_tokens=False)
        return [tuple(e.ids) for e in encodings]

    def _fewer_unknowns(self, words: Sequence[str], pieces: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
        """PIECES, each word's, with a word the vocabulary does not know ([UNK] among its pieces)
        tokenised again in its NFKC form where that leaves fewer unknown pieces: fullwidth Ｌｅｔｔｅｒｓ
        and １２３, mathematical 𝐁𝐨𝐥𝐝 (styled names in social media), ligatures are letters and
        digits the vocabulary has in their plain form. A word it knows is never changed, so a model
        reads what it was trained on."""
        unknown = self.unk_id
        plain: dict[int, str] = {}
        for i, (word, ids) in enumerate(zip(words, pieces, strict=True)):
            if unknown in ids and not word.isascii():
                normalised = unicodedata.normalize("NFKC", word)
                if normalised != word and normalised.strip():
                    plain[i] = normalised
        if not plain:
            return pieces
        chosen = list(pieces)
        for i, ids in zip(plain, self._encode_alone(list(plain.values())), strict=True):
            if ids and ids.count(unknown) < chosen[i].count(unknown):
                chosen[i] = ids
        return chosen

    def tokenize_sentences(self, sentences: Sequence[Sequence[str]]) -> list[Tokenized]:
        """`tokenize` for a tokenizer whose split of a word may depend on the words around it."""
        encodings = self.tokenizer.encode_batch([list(s) for s in sentences], is_pretokenized=True, add_special_tokens=False)
        tokenized = []
        for words, encoding in zip(sentences, encodings, strict=True):
            pieces: list[list[int]] = [[] for _ in words]
            for token, word in zip(encoding.ids, encoding.word_ids, strict=True):
                if word is not None:
                    pieces[word].append(token)
            ids = self._fewer_unknowns(words, [tuple(p) if p else (self.unk_id,) for p in pieces])
            tokenized.append(Tokenized.of(words, ids))
        return tokenized

    def encode(self, sentences: Sequence[Words]) -> SubwordBatch:
        plain = [s for s in sentences if not isinstance(s, Tokenized)]
        fresh = iter(self.tokenize(plain))
        ready = [s if isinstance(s, Tokenized) else next(fresh) for s in sentences]
        word_counts = [len(s.counts) // COUNT_SIZE for s in ready]
        piece_lengths = np.frombuffer(b"".join([s.counts for s in ready]), dtype=COUNT_DTYPE).astype(np.int64)
        word_ids = np.frombuffer(b"".join([s.ids for s in ready]), dtype=SUBWORD_DTYPE)
        # sub-words a sentence, its specials included
        inner = np.array([len(s.ids) // ID_SIZE for s in ready], dtype=np.int64)
        counts = inner + self.special_count
        too_long = np.flatnonzero(counts > self.max_subwords)
        if len(too_long):
            index = int(too_long[0])
            raise SentenceTooLong(f"sentence {index} has {counts[index]} sub-words (limit {self.max_subwords})")
        # the batch's sub-words flat, sentence after sentence: prefix, its words' ids, suffix
        starts = np.cumsum(counts) - counts
        flat_ids = np.empty(int(counts.sum()), dtype=np.int64)
        for place, token in enumerate(self.prefix):
            flat_ids[starts + place] = token
        for place, token in enumerate(self.suffix):
            flat_ids[starts + counts - len(self.suffix) + place] = token
        within = np.arange(len(word_ids)) - np.repeat(np.cumsum(inner) - inner, inner)
        flat_ids[np.repeat(starts + len(self.prefix), inner) + within] = word_ids
        return self.batch_of(flat_ids, counts.tolist(), piece_lengths, word_counts)

    def batch_of(
        self, flat_ids: np.ndarray, counts: list[int], piece_lengths: np.ndarray, word_counts: list[int]
    ) -> SubwordBatch:
        """The batch's sub-word ids flat (specials included), each sentence's count, and each word's
        sub-word count → packed arrays, each filled in one scatter."""
        batch = len(counts)
        rows = packed_rows(counts, self.row_subwords, self.attention_cost)
        row_of, start_of, segment_of = [0] * batch, [0] * batch, [0] * batch
        seq = 0
        for r, row in enumerate(rows):
            start = 0
            for segment, i in enumerate(row, start=1):
                row_of[i], start_of[i], segment_of[i] = r, start, segment
                start += counts[i]
            seq = max(seq, start)
        # every sub-word of every sentence, flat: its place in its sentence and in the packed rows
        sizes = np.array(counts, dtype=np.int64)
        offsets = np.arange(len(flat_ids)) - np.repeat(np.cumsum(sizes) - sizes, sizes)
        slots = np.repeat(np.array(row_of, dtype=np.int64) * seq + np.array(start_of, dtype=np.int64), sizes) + offsets
        input_ids = np.full(len(rows) * seq, self.pad_id, dtype=np.int64)
        segment_ids = np.zeros(len(rows) * seq, dtype=np.int64)
        position_ids = np.zeros(len(rows) * seq, dtype=np.int64)
        input_ids[slots] = flat_ids
        segment_ids[slots] = np.repeat(np.array(segment_of, dtype=np.int64), sizes)
        position_ids[slots] = offsets
        token_index = np.zeros((batch, max(counts)), dtype=np.int64)
        token_index[np.repeat(np.arange(batch), sizes), offsets] = slots
        subword_index, subword_mask, word_mask = _word_maps(piece_lengths, word_counts, len(self.prefix))
        return SubwordBatch(
            input_ids.reshape(len(rows), seq),
            segment_ids.reshape(len(rows), seq),
            position_ids.reshape(len(rows), seq),
            token_index,
            subword_index,
            subword_mask,
            word_mask,
            word_counts,
            piece_lengths,
            len(self.prefix),
            counts,
        )


def _word_maps(
    piece_lengths: np.ndarray, word_counts: list[int], first_position: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """subword_index and subword_mask [B, N, P] and word_mask [B, N], each filled in one scatter."""
    batch, n_words = len(word_counts), max(word_counts)
    words = np.array(word_counts, dtype=np.int64)
    pieces = piece_lengths
    per_word = int(pieces.max(initial=1))
    word_firsts = np.cumsum(words) - words  # each sentence's first word, flat
    word_slots = np.repeat(np.arange(batch) * n_words - word_firsts, words) + np.arange(len(pieces))
    piece_firsts = np.cumsum(pieces) - pieces  # each word's first sub-word, flat over the batch
    # a word's first sub-word within its sentence: past the prefix and the sentence's earlier words
    word_starts = first_position + piece_firsts - np.repeat(piece_firsts[word_firsts[words > 0]], words[words > 0])
    columns = np.arange(int(pieces.sum())) - np.repeat(piece_firsts, pieces)
    rows = np.repeat(word_slots, pieces)
    subword_index = np.zeros((batch * n_words, per_word), dtype=np.int64)
    subword_mask = np.zeros((batch * n_words, per_word), dtype=np.float32)
    word_mask = np.zeros(batch * n_words, dtype=np.float32)
    # a word's unused slots repeat its first sub-word: a max over all P slots is then the max over
    # its sub-words, with no mask in the graph
    subword_index[word_slots] = word_starts[:, None]
    subword_index[rows, columns] = np.repeat(word_starts, pieces) + columns
    subword_mask[rows, columns] = 1
    word_mask[word_slots] = 1
    shape = (batch, n_words, per_word)
    return subword_index.reshape(shape), subword_mask.reshape(shape), word_mask.reshape(batch, n_words)


# Pre-tokenizers that split each pre-tokenised word on its own (WordPiece's, whitespace's, and
# SentencePiece's Metaspace when it marks every word): a word's sub-words are then the same in any
# sentence. Others (Metaspace marking only the first word, byte-level BPE) are tokenised by sentence.
INDEPENDENT_PRE_TOKENIZERS = frozenset({"BertPreTokenizer", "Whitespace", "WhitespaceSplit"})
WORD_CACHE_SIZE = 1 << 18  # distinct words remembered; the cache starts over when it is full


def words_are_independent(tokenizer: Tokenizer) -> bool:
    described = json.loads(tokenizer.to_str()).get("pre_tokenizer") or {}
    kinds = [p for p in described.get("pretokenizers", [described])]
    return bool(kinds) and all(
        p.get("type") in INDEPENDENT_PRE_TOKENIZERS or (p.get("type") == "Metaspace" and p.get("prepend_scheme") == "always")
        for p in kinds
    )


def _special_template(tokenizer: Tokenizer) -> tuple[list[int], list[int]]:
    """The ids the tokenizer's post-processor puts before and after a single sentence, found by
    encoding one word with and without them (BERT: [CLS] / [SEP]; T5: none / </s>)."""
    bare = tokenizer.encode(["a"], is_pretokenized=True, add_special_tokens=False).ids
    full = tokenizer.encode(["a"], is_pretokenized=True).ids
    for start in range(len(full) - len(bare) + 1):
        if full[start : start + len(bare)] == bare:
            return full[:start], full[start + len(bare) :]
    raise ValueError("cannot find the sentence inside the tokenizer's special-token template")
