"""Runs the label-matching graph for a batch of sentences (numpy in, numpy out).

Each sentence is read with its request's label names in front of it: `[CLS] m name₁ m name₂ …
[SEP] words [SEP]` (m: the marker token), packed into encoder rows like any sentence. A label
list longer than one pass takes (`labels_per_pass` names, or the prompt's sub-word room) is split
over several passes of the same sentence, never truncated; their scores are joined per sentence.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property, lru_cache

import numpy as np

from nerserve.ner.archs.base import ProgramBase
from nerserve.ner.archs.feeds import char_feeds, subword_feeds
from nerserve.ner.archs.gliner.config import GlinerConfig, GlinerOptions
from nerserve.ner.archs.gliner.decode import decode_batch
from nerserve.ner.archs.grouping import groups_for
from nerserve.ner.text.chars import SHAPES, encode_chars
from nerserve.ner.text.subword import Tokenized, Words
from nerserve.ner.types import EntitySet

PUNCTUATION = SHAPES.index("punctuation")
# Padding words a group of passes may carry rather than take another graph call: a call's own cost
# (a few hundred nodes) is about what this many words cost the layers over words, so that small
# batches are not cut into calls of a sentence or two.
PADDING_WORDS_PER_CALL = 64


@dataclass
class GlinerBatch:
    sentences: list[Tokenized]
    lengths: list[int]
    padded_tokens: int  # the sentences' sub-words padded (the prompt comes with the request's labels, in `run`)
    spans: np.ndarray  # [B, S, 2] int64: every span of 1..max_width words; padding is [0, 1)
    span_mask: np.ndarray  # [B, S] bool


@dataclass(frozen=True)
class Pass:
    """One encoder row: a sentence and a slice of its label list."""

    sentence: int
    first_label: int
    labels: tuple[str, ...]


def enumerate_spans(n_words: int, max_width: int) -> list[tuple[int, int]]:
    return [(i, i + w) for i in range(n_words) for w in range(1, max_width + 1) if i + w <= n_words]


@lru_cache(maxsize=1024)
def span_array(n_words: int, max_width: int) -> np.ndarray:
    """enumerate_spans as a read-only [S, 2] array, made once per sentence length."""
    spans = np.array(enumerate_spans(n_words, max_width), dtype=np.int64).reshape(-1, 2)
    spans.flags.writeable = False
    return spans


def names_something(shapes: Sequence[bytes], spans: np.ndarray) -> np.ndarray:
    """Per span of each sentence ([B, S, 2]; its words' shape ids, CharRows.shapes): whether a word
    of it has a letter or a digit (a word of the "punctuation" shape has neither). A span of symbols
    alone ("@", "--") names nothing; one tweet set's conversion marks the "@" of every user mention
    as an entity of its own, which a model trained on it would return to every user."""
    wordy = np.frombuffer(b"".join(shapes), dtype=np.uint8) != PUNCTUATION
    counts = np.fromiter(map(len, shapes), dtype=np.int64, count=len(shapes))
    before = np.concatenate(([0], np.cumsum(wordy)))  # wordy words before each word, batch-flat
    firsts = np.cumsum(counts) - counts
    found = before[np.minimum(firsts[:, None, None] + spans, len(wordy))]
    return np.asarray(found[..., 1] > found[..., 0], dtype=bool)


def scored_spans(batch: GlinerBatch, sentences: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """The spans the graph scores for rows of these sentences: those of each row's sentence in
    `span_mask`, packed ([T, 3] int64: row, first word, end word), and each row's slots [R, S]
    int64: the index of its span s in the packed spans, or T where none is scored."""
    mask = batch.span_mask[sentences]
    rows, slots = np.nonzero(mask)
    spans = np.empty((len(rows), 3), dtype=np.int64)
    spans[:, 0] = rows
    spans[:, 1:] = batch.spans[np.asarray(sentences, dtype=np.int64)[rows], slots]
    span_slots = np.full(mask.shape, len(rows), dtype=np.int64)
    span_slots[rows, slots] = np.arange(len(rows))
    return spans, span_slots


class GlinerProgram(ProgramBase[GlinerConfig, GlinerBatch, GlinerOptions]):
    # a sentence window leaves the prompt at least the rest of the backbone's 512 positions
    window_subwords = 256

    @cached_property
    def prompt_room(self) -> int:
        """Sub-words a pass's prompt may take: what a full window leaves (separator included)."""
        return self.subwords.max_subwords - self.subwords.special_count - self.window_subwords - 1

    @cached_property
    def marker_id(self) -> int:
        return self.token_id(self.config.marker)

    @cached_property
    def separator_id(self) -> int:
        return self.token_id(self.config.separator)

    def token_id(self, token: str) -> int:
        found = self.subwords.tokenizer.token_to_id(token)
        if found is None:
            raise ValueError(f"the backbone's tokenizer has no {token!r} token for the prompt")
        return int(found)

    @lru_cache(maxsize=4096)  # noqa: B019 - one program per model, label names repeat across requests
    def name_pieces(self, name: str) -> tuple[int, ...]:
        ids = self.subwords.tokenizer.encode(name, add_special_tokens=False).ids
        return tuple(ids[: self.prompt_room - 2]) or (self.subwords.unk_id,)

    def labels_of(self, options: GlinerOptions) -> tuple[str, ...]:
        return options.labels or self.config.labels

    def passes(self, sentence: int, labels: tuple[str, ...], subwords: int) -> list[Pass]:
        """The label list cut into passes of at most `labels_per_pass` names and the sub-words the
        sentence (of `subwords`) leaves the prompt."""
        room = self.subwords.max_subwords - self.subwords.special_count - 1 - subwords
        found: list[Pass] = []
        first, used = 0, 0
        for index, name in enumerate(labels):
            cost = 1 + len(self.name_pieces(name))
            if index > first and (index - first >= self.config.labels_per_pass or used + cost > room):
                found.append(Pass(sentence, first, labels[first:index]))
                first, used = index, 0
            used += cost
        found.append(Pass(sentence, first, labels[first:]))
        return found

    def prepare(self, sentences: Sequence[Words]) -> GlinerBatch:
        plain = [list(s) for s in sentences if not isinstance(s, Tokenized)]
        fresh = iter(self.subwords.tokenize(plain) if plain else [])
        ready = [s if isinstance(s, Tokenized) else next(fresh) for s in sentences]
        lengths = [len(s.words) for s in ready]
        listed = [span_array(n, self.config.max_width) for n in lengths]
        width = max(1, max(len(x) for x in listed))
        spans = np.zeros((len(ready), width, 2), dtype=np.int64)
        spans[..., 1] = 1
        span_mask = np.zeros((len(ready), width), dtype=bool)
        for b, found in enumerate(listed):
            spans[b, : len(found)] = found
            span_mask[b, : len(found)] = True
        span_mask &= names_something([s.char_rows.shapes for s in ready], spans)
        longest = max((s.subwords for s in ready), default=0)
        return GlinerBatch(ready, lengths, len(ready) * (longest + self.subwords.special_count), spans, span_mask)

    def row(self, sentence: Tokenized, labels: tuple[str, ...]) -> Tokenized:
        """The prompt's words (marker, name, …, separator) and then the sentence's, as one sentence."""
        words: list[str] = []
        pieces: list[tuple[int, ...]] = []
        for name in labels:
            words += [self.config.marker, name]
            pieces += [(self.marker_id,), self.name_pieces(name)]
        words.append(self.config.separator)
        pieces.append((self.separator_id,))
        return Tokenized.of(words, pieces).followed_by(sentence)

    def feeds(self, batch: GlinerBatch, passes: Sequence[Pass]) -> dict[str, np.ndarray]:
        """The graph's inputs for these passes (one encoder row each)."""
        sentences = [batch.sentences[p.sentence] for p in passes]
        encoded = self.subwords.encode([self.row(s, p.labels) for s, p in zip(sentences, passes, strict=True)])
        n_words = max(len(s.words) for s in sentences)
        chars = encode_chars([s.char_rows for s in sentences], n_words)
        word_mask = np.zeros((len(passes), n_words), dtype=np.float32)
        text_index = np.zeros((len(passes), n_words), dtype=np.int64)
        label_index = np.ones((len(passes), max(len(p.labels) for p in passes)), dtype=np.int64)
        for r, (sentence, one) in enumerate(zip(sentences, passes, strict=True)):
            count = len(sentence.words)
            word_mask[r, :count] = 1.0
            text_index[r, :count] = np.arange(count) + 2 * len(one.labels) + 1
            label_index[r, : len(one.labels)] = np.arange(len(one.labels)) * 2 + 1
        spans, span_slots = scored_spans(batch, [p.sentence for p in passes])
        return {
            **subword_feeds(encoded),
            **char_feeds(chars),
            "word_mask": word_mask,
            "text_index": text_index,
            "label_index": label_index,
            "spans": spans,
            "span_slots": span_slots,
        }

    def run(self, batch: GlinerBatch, options: GlinerOptions | Sequence[GlinerOptions] | None = None) -> dict[str, np.ndarray]:
        """scores [B, S, L]: every span of each sentence against every label of its request (L: the
        longest list of the batch; a shorter list's columns past its end are 0)."""
        chosen = self.per_sentence(options, len(batch.lengths))
        labels = [self.labels_of(o) for o in chosen]
        passes = [p for b, names in enumerate(labels) for p in self.passes(b, names, batch.sentences[b].subwords)]
        scores = np.zeros((len(batch.lengths), batch.spans.shape[1], max(len(n) for n in labels)), dtype=np.float32)
        for group in self.pass_groups(batch, passes):
            found = self.graphs["encoder"].run(self.feeds(batch, group))["scores"]
            for r, one in enumerate(group):
                columns = slice(one.first_label, one.first_label + len(one.labels))
                scores[one.sentence, : found.shape[1], columns] = found[r, :, : len(one.labels)]
        return {"scores": scores}

    def pass_groups(self, batch: GlinerBatch, passes: list[Pass]) -> list[list[Pass]]:
        """On the CPU, passes of sentences of similar lengths together: the layers over words (the
        BiLSTM, the span ends) cost what a batch padded to its longest sentence does. A GPU takes
        the whole batch in one call."""
        sizes = [batch.lengths[p.sentence] for p in passes]
        groups = groups_for(self.graphs["encoder"], sizes, allowance=PADDING_WORDS_PER_CALL)
        return [[passes[r] for r in rows.tolist()] for rows in groups]

    def export_values(self, batch: GlinerBatch) -> dict[str, np.ndarray]:
        passes = [Pass(b, 0, self.config.labels[: self.config.labels_per_pass]) for b in range(len(batch.lengths))]
        feeds = self.feeds(batch, passes)
        return {**feeds, **self.graphs["encoder"].run(feeds)}

    def decode(
        self,
        batch: GlinerBatch,
        outputs: Mapping[str, np.ndarray],
        options: GlinerOptions | Sequence[GlinerOptions] | None = None,
    ) -> list[EntitySet]:
        chosen = self.per_sentence(options, len(batch.lengths))
        return decode_batch(outputs["scores"], batch.spans, batch.span_mask, [self.labels_of(o) for o in chosen], chosen)
