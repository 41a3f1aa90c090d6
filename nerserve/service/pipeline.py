"""Request text → graph-sized sentence units → entities with exact character offsets.

Raw text is split into sentences of words (ner.text.segment); a sentence longer than the window
budget (sub-words) is cut into overlapping windows. Each window reports only the entities that
start inside its *core*; the cores partition the sentence, so nothing is lost at window edges and
nothing is reported twice. Pre-tokenised input is one sentence per token list, the tokens joined
by single spaces for character offsets.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from nerserve.ner.text.segment import PLAIN_WORDS, WordStyle, as_read, split_sentences, words_of_tokens
from nerserve.ner.text.subword import SubwordEncoder, Tokenized, load_tokenizer
from nerserve.ner.types import EntitySet, Word, fragment_char_spans


class Unit(NamedTuple):
    """One graph input: a sentence, or a window of a long one, tokenised once here (the batcher
    and the program reuse the sub-words). A named tuple: a request makes one a sentence."""

    text_index: int
    sentence: Tokenized
    word_offset: int  # index in the text's word list of this unit's first word
    core: tuple[int, int]  # text-level word range whose entities this unit reports
    cost: int  # sub-words, specials included: what the batcher's token budget counts


@dataclass
class PlannedText:
    text: str
    words: list[Word]
    units: list[Unit]


def windows(counts: list[int], budget: int, overlap: int) -> list[tuple[int, int, int, int]]:
    """(start, end, core_start, core_end) word windows whose sub-word counts fit `budget`;
    consecutive windows overlap by up to `overlap` words, and by at most half of a window's words,
    so each window advances by at least half of itself: a sentence of long words (few per window)
    costs at most about twice its sub-words, not a window per word. Cores meet halfway."""
    n = len(counts)
    if sum(counts) <= budget:  # nearly every sentence: one window, the whole of it
        return [(0, n, 0, n)]
    spans: list[tuple[int, int]] = []
    start = 0
    while True:
        end, total = start, 0
        while end < n and total + counts[end] <= budget:
            total += counts[end]
            end += 1
        end = max(end, start + 1)  # a single word over the budget still goes, alone
        spans.append((start, end))
        if end >= n:
            break
        start = max(start + 1, end - min(overlap, (end - start) // 2))
    result = []
    for i, (s, e) in enumerate(spans):
        core_start = 0 if i == 0 else (s + spans[i - 1][1]) // 2
        core_end = n if i == len(spans) - 1 else (spans[i + 1][0] + e) // 2
        result.append((s, e, core_start, core_end))
    return result


class TooManySentences(ValueError):
    """More sentences than a request may hold: their count, so far."""

    def __init__(self, count: int) -> None:
        super().__init__(f"{count} sentences")
        self.count = count


class Planner:
    def __init__(
        self, subwords: SubwordEncoder, window_subwords: int, overlap_words: int, words: WordStyle = PLAIN_WORDS
    ) -> None:
        self.subwords = subwords
        self.budget = window_subwords - subwords.special_count
        self.overlap = overlap_words
        self.words = words  # how the model's training data writes words

    def clipped(self, sentence: Tokenized) -> Tokenized:
        """A word longer than a whole window (e.g. "a-a-a-…", a long CJK run) keeps only the
        sub-words that fit: it is still one word with its own offsets, and its window still fits."""
        return Tokenized.of(sentence.words, [piece[: self.budget] for piece in sentence.pieces])

    def plan(
        self, texts: list[str] | None = None, tokens: list[list[str]] | None = None, max_sentences: int | None = None
    ) -> list[PlannedText]:
        """The texts (or token lists) as planned texts; TooManySentences, before any is tokenised,
        where they hold more than MAX_SENTENCES sentences (windows would only add to them)."""
        planned: list[PlannedText] = []
        sentences: list[tuple[int, int, list[str]]] = []  # (text index, first word index, the words' texts)
        if texts is not None:
            for t, text in enumerate(texts):
                words: list[Word] = []
                split = split_sentences(text, self.words)
                for sentence, read in zip(split, as_read([[word.text for word in s] for s in split], text), strict=True):
                    sentences.append((t, len(words), read))
                    words.extend(sentence)
                planned.append(PlannedText(text, words, []))
        else:
            for t, token_list in enumerate(tokens or []):
                text, words = words_of_tokens(token_list)
                sentences.append((t, 0, as_read([token_list], text)[0]))
                planned.append(PlannedText(text, words, []))
        if max_sentences is not None and len(sentences) > max_sentences:
            raise TooManySentences(len(sentences))
        tokenized = self.subwords.tokenize([words for _, _, words in sentences]) if sentences else []
        specials = self.subwords.special_count
        for (t, first, _), tokens_of in zip(sentences, tokenized, strict=True):
            counts = tokens_of.piece_counts
            if max(counts, default=0) > self.budget:
                tokens_of = self.clipped(tokens_of)
                counts = tokens_of.piece_counts
            for s, e, core_start, core_end in windows(counts, self.budget, self.overlap):
                cost = sum(counts[s:e]) + specials
                part = tokens_of.window(s, e)
                _ = part.char_rows  # made here, where requests are planned, and not in the engine
                unit = Unit(t, part, first + s, (first + core_start, first + core_end), cost)
                planned[t].units.append(unit)
        return planned


@dataclass(frozen=True)
class PlanningRule:
    """How a model's requests are planned, in a form another process can rebuild it from (an HTTP
    worker plans its own requests): the tokenizer's folder, what identifies its tokenizer (models
    whose tokenizers are the same file share one encoder there), the window and its overlap, and how
    the model's training data writes words."""

    tokenizer_folder: Path
    tokenizer: str
    window_subwords: int
    overlap_words: int
    words: WordStyle = PLAIN_WORDS

    @classmethod
    def of(
        cls, tokenizer_folder: Path, window_subwords: int, overlap_words: int, words: WordStyle = PLAIN_WORDS
    ) -> PlanningRule:
        found = tokenizer_folder / "tokenizer.json"
        identity = hashlib.sha256(found.read_bytes()).hexdigest() if found.is_file() else str(tokenizer_folder.resolve())
        return cls(tokenizer_folder, identity, window_subwords, overlap_words, words)

    def subword_encoder(self) -> SubwordEncoder:
        return SubwordEncoder(load_tokenizer(self.tokenizer_folder))

    def planner(self, subwords: SubwordEncoder | None = None) -> Planner:
        """The planner; `subwords`, an encoder of this tokenizer already made (the model's own,
        where the model is loaded)."""
        return Planner(subwords or self.subword_encoder(), self.window_subwords, self.overlap_words, self.words)


def assemble(planned: PlannedText, results: list[EntitySet]) -> list[dict[str, Any]]:
    """Unit-level entity sets → the text's entities, character offsets included, deduplicated."""
    found: dict[tuple[str, tuple[tuple[int, int], ...]], float] = {}
    for unit, entities in zip(planned.units, results, strict=True):
        for entity in entities:
            fragments = tuple((s + unit.word_offset, e + unit.word_offset) for s, e in entity.fragments)
            if not unit.core[0] <= fragments[0][0] < unit.core[1]:
                continue  # another window owns this start
            key = (entity.type, fragments)
            found[key] = max(found.get(key, 0.0), entity.score)
    out = []
    for (label, fragments), score in sorted(found.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        spans = fragment_char_spans(fragments, planned.words)
        out.append(
            {
                "type": label,
                "text": " ".join(planned.text[a:b] for a, b in spans),
                "score": round(float(score), 6),
                "start": min(a for a, _ in spans),  # the whole extent, as spaCy / GLiNER users read an entity
                "end": max(b for _, b in spans),
                "spans": spans,
                "token_spans": list(fragments),
            }
        )
    return out


def keep_labels(entities: list[dict[str, Any]], labels: set[str]) -> list[dict[str, Any]]:
    """Only the entity types a request asked a closed-label model for."""
    return [entity for entity in entities if entity["type"] in labels]


def flatten(entities: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Non-overlapping entities (by whole extent), the highest scores first, in text order: what a
    consumer that holds one label per word (BIO, spaCy's doc.ents) can take."""
    kept: list[dict[str, Any]] = []
    for entity in sorted(entities, key=lambda e: (-e["score"], e["start"], e["end"])):
        if all(entity["end"] <= other["start"] or other["end"] <= entity["start"] for other in kept):
            kept.append(entity)
    return sorted(kept, key=lambda e: (e["start"], e["end"], e["type"]))
