"""Reader for the canonical JSONL format of ../shared/data (see its README).

One JSON object per line: {"tokens": [...], "entities": [{"type": T, "spans": [[s, e], ...]}]}.
Every problem is reported as a DataError naming the file and line, so a bad record never ends in
a traceback deep inside training.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from nerserve.ner.types import Entity, EntitySet

SPLITS = ("train", "dev", "test")


class DataError(ValueError):
    """A dataset file or record that does not follow the canonical format."""


@dataclass(frozen=True)
class Sentence:
    tokens: tuple[str, ...]
    entities: EntitySet


def _fail(path: Path, line: int, message: str) -> DataError:
    return DataError(f"{path}:{line}: {message}")


def _parse_entity(raw: object, n_tokens: int, path: Path, line: int) -> Entity:
    if not isinstance(raw, dict):
        raise _fail(path, line, f"entity must be an object, got {type(raw).__name__}")
    label = raw.get("type")
    spans = raw.get("spans")
    if not isinstance(label, str) or not label:
        raise _fail(path, line, "entity 'type' must be a non-empty string")
    if not isinstance(spans, list) or not spans:
        raise _fail(path, line, f"entity {label!r}: 'spans' must be a non-empty list")
    fragments: list[tuple[int, int]] = []
    for span in spans:
        if (
            not isinstance(span, list)
            or len(span) != 2
            or not all(isinstance(x, int) and not isinstance(x, bool) for x in span)
        ):
            raise _fail(path, line, f"entity {label!r}: span {span!r} must be [start, end] integers")
        start, end = span
        if not 0 <= start < end <= n_tokens:
            raise _fail(path, line, f"entity {label!r}: span {span} outside 0..{n_tokens} or empty")
        fragments.append((start, end))
    try:
        return Entity(label, tuple(fragments))
    except ValueError as error:
        raise _fail(path, line, f"entity {label!r}: {error}") from None


def parse_line(text: str, path: Path, line: int) -> Sentence:
    try:
        record = json.loads(text)
    except json.JSONDecodeError as error:
        raise _fail(path, line, f"invalid JSON ({error.msg} at column {error.colno})") from None
    if not isinstance(record, dict):
        raise _fail(path, line, "record must be a JSON object")
    tokens = record.get("tokens")
    if not isinstance(tokens, list) or not tokens:
        raise _fail(path, line, "'tokens' must be a non-empty list of strings")
    for index, token in enumerate(tokens):
        if not isinstance(token, str) or not token or any(c.isspace() for c in token):
            raise _fail(path, line, f"token {index} ({token!r}) must be a non-empty string without whitespace")
    raw_entities = record.get("entities", [])
    if not isinstance(raw_entities, list):
        raise _fail(path, line, "'entities' must be a list")
    entities = EntitySet(_parse_entity(raw, len(tokens), path, line) for raw in raw_entities)
    return Sentence(tuple(tokens), entities)


def iter_file(path: Path) -> Iterator[Sentence]:
    if not path.is_file():
        raise DataError(f"{path}: no such data file")
    with path.open(encoding="utf-8") as handle:
        for number, text in enumerate(handle, start=1):
            if text.strip():
                yield parse_line(text, path, number)


def read_split(data_dir: Path, split: str, limit: int | None = None) -> list[Sentence]:
    """Read `<data_dir>/<split>.jsonl`, the first `limit` sentences if given."""
    if split not in SPLITS:
        raise DataError(f"unknown split {split!r}: choose one of {', '.join(SPLITS)}")
    if not data_dir.is_dir():
        raise DataError(f"{data_dir}: no such data folder")
    sentences: list[Sentence] = []
    for sentence in iter_file(data_dir / f"{split}.jsonl"):
        sentences.append(sentence)
        if limit is not None and len(sentences) >= limit:
            break
    return sentences


def label_set(sentences: list[Sentence]) -> list[str]:
    return sorted({entity.type for sentence in sentences for entity in sentence.entities})


def label_names(data_dir: Path) -> dict[str, str | None]:
    """Raw type → natural label name from the folder's `labels.json` (empty if none); a `null`
    name means the type is neither asked for nor scored."""
    path = data_dir / "labels.json"
    if not path.is_file():
        return {}
    try:
        names = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise DataError(f"{path}: not valid JSON ({error})") from None
    if not isinstance(names, dict) or not all(isinstance(v, str | None) for v in names.values()):
        raise DataError(f"{path}: must map each type to a name or null")
    return names


def named_split(data_dir: Path, split: str, limit: int | None = None) -> tuple[list[Sentence], tuple[str, ...]]:
    """A split with its entity types renamed to the natural label names (for open-label models),
    entities of a null name dropped, and the label names to ask for: from labels.json, else the
    split's own types."""
    names = label_names(data_dir)
    sentences = []
    for sentence in read_split(data_dir, split, limit):
        kept = [
            Entity(names.get(e.type) or e.type, e.fragments, e.score)
            for e in sentence.entities
            if names.get(e.type, e.type) is not None
        ]
        sentences.append(Sentence(sentence.tokens, EntitySet(kept)))
    asked = sorted({n for n in names.values() if n}) if names else label_set(sentences)
    return sentences, tuple(asked)
