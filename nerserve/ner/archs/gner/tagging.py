"""GNER's text format at the token level (tokenizers, no torch): the prompt (instruction, label
list, sentence), the target `w1(O) w2(B-person) w3(I-person) …` as token ids, and the parse of a
generated sequence back into (word, tag) pairs.

Targets are built word by word from the same sub-words the encoder reads, so a word is written as
exactly the tokens the constrained decoder forces (ner.archs.gner.constraint). Parsing goes
through the tokenizer's own decoding to text, which serves any tokenizer (WordPiece puts spaces
around punctuation, SentencePiece does not), and compares tag names after the same round trip
("back-tokenisation").
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

from tokenizers import Tokenizer

OUTSIDE = "O"
TAG_GROUP = re.compile(r"\(\s*([^()]*?)\s*\)")


def tag_texts(labels: Sequence[str]) -> list[str]:
    """The tags a request's labels allow: O, then B-<label> and I-<label> for each label."""
    return [OUTSIDE] + [f"{prefix}-{label}" for label in labels for prefix in ("B", "I")]


def squeeze(text: str) -> str:
    """A decoded string compared without case and whitespace (decoders differ in both)."""
    return "".join(text.split()).lower()


@dataclass(frozen=True)
class Tag:
    begins: bool
    label: str | None  # None: outside


@dataclass
class TagCodec:
    """The tags of one label list: their token ids (targets, constraint) and the decoded text
    each one comes back as (parsing)."""

    tokenizer: Tokenizer
    labels: tuple[str, ...]
    sequences: list[tuple[int, ...]] = field(init=False)

    def __post_init__(self) -> None:
        self.sequences = [tuple(self.tokenizer.encode(t, add_special_tokens=False).ids) for t in tag_texts(self.labels)]

    @cached_property
    def by_text(self) -> dict[str, Tag]:
        tags: dict[str, Tag] = {squeeze(self.tokenizer.decode(list(self.sequences[0]))): Tag(False, None)}
        for index, label in enumerate(self.labels):
            begin, inside = self.sequences[1 + 2 * index], self.sequences[2 + 2 * index]
            tags.setdefault(squeeze(self.tokenizer.decode(list(begin))), Tag(True, label))
            tags.setdefault(squeeze(self.tokenizer.decode(list(inside))), Tag(False, label))
        return tags

    def tag_ids(self, tag: Tag) -> tuple[int, ...]:
        if tag.label is None:
            return self.sequences[0]
        return self.sequences[1 + 2 * self.labels.index(tag.label) + (0 if tag.begins else 1)]

    def read(self, text: str) -> Tag:
        """A generated tag's text → the tag; a label not in the request is outside (the paper's rule)."""
        return self.by_text.get(squeeze(text), Tag(False, None))


@dataclass(frozen=True)
class Markers:
    """Token ids of the format's fixed parts for one tokenizer."""

    open: tuple[int, ...]  # "("
    close: tuple[int, ...]  # ")"
    start: int  # the decoder's first input
    end: int  # the end of the sequence

    @classmethod
    def of(cls, tokenizer: Tokenizer, start: int, end: int) -> Markers:
        def ids(text: str) -> tuple[int, ...]:
            return tuple(tokenizer.encode(text, add_special_tokens=False).ids)

        return cls(ids("("), ids(")"), start, end)


def target_ids(pieces: Sequence[Sequence[int]], tags: Sequence[Tag], codec: TagCodec, markers: Markers) -> list[int]:
    """The teacher sequence of one sentence: for each word its sub-words, "(", its tag, ")"; then the end."""
    ids: list[int] = []
    for word, tag in zip(pieces, tags, strict=True):
        ids += [*word, *markers.open, *codec.tag_ids(tag), *markers.close]
    return [*ids, markers.end]


def parse_pairs(text: str) -> list[tuple[str, str]]:
    """Decoded output → (word, tag text) pairs, in order: a word is whatever stands between the
    previous tag group and the next one (so "(" and ")" can be words themselves)."""
    pairs = []
    previous = 0
    for match in TAG_GROUP.finditer(text):
        word = text[previous : match.start()].strip()
        previous = match.end()
        if word:
            pairs.append((word, match.group(1)))
    return pairs


def bio_entities(tags: Sequence[Tag]) -> list[tuple[str, int, int]]:
    """Word tags → (label, start, end) spans; an I- that does not continue its label starts one."""
    spans: list[tuple[str, int, int]] = []
    for index, tag in enumerate(tags):
        if tag.label is None:
            continue
        continues = spans and not tag.begins and spans[-1][0] == tag.label and spans[-1][2] == index
        if continues:
            spans[-1] = (tag.label, spans[-1][1], index + 1)
        else:
            spans.append((tag.label, index, index + 1))
    return spans


def tags_of(length: int, entities: Sequence[tuple[str, int, int]]) -> list[Tag]:
    """(label, start, end) spans → one tag per word (BIO)."""
    tags = [Tag(False, None)] * length
    for label, start, end in entities:
        tags[start] = Tag(True, label)
        for index in range(start + 1, end):
            tags[index] = Tag(False, label)
    return tags
