"""A spaCy pipeline component that asks a nerserve server (`pip install nerserve[spacy]`):

    nlp = spacy.blank("en")
    nlp.add_pipe("nerserve", config={"url": "http://127.0.0.1:8000", "model": "span-genia"})
    doc = nlp("IL-2 gene expression requires NF-kappa B.")

Flat results go to `doc.ents` (a non-overlapping subset: the highest scores first), and every
entity, nested and discontinuous ones included, to `doc.spans[spans_key]`, each span over the
entity's whole extent with `span._.nerserve_fragments` (its character spans, one per fragment)
and `span._.nerserve_score`. Tokens are spaCy's; an entity boundary inside a token expands to
the whole token. `nlp.pipe` sends documents in batches.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from typing import Any

from spacy.language import Language
from spacy.tokens import Doc, Span

from nerserve.client import Client, Entity

Span.set_extension("nerserve_fragments", default=None, force=True)
Span.set_extension("nerserve_score", default=None, force=True)


class NerServeComponent:
    def __init__(
        self,
        url: str,
        model: str | None,
        labels: list[str] | None,
        options: dict[str, Any],
        spans_key: str,
        batch_size: int,
        timeout: float,
        api_key_env: str | None = None,
    ) -> None:
        # the key is read from the environment variable the config names, never kept in the
        # config (nlp.to_disk writes the config out)
        api_key = os.environ.get(api_key_env) if api_key_env else None
        self.client = Client(url, timeout=timeout, batch_size=batch_size, api_key=api_key)
        self.model, self.labels, self.options, self.spans_key = model, labels, options, spans_key
        self.batch_size = batch_size

    def __call__(self, doc: Doc) -> Doc:
        return next(self.pipe([doc]))

    def pipe(self, docs: Iterable[Doc], batch_size: int | None = None) -> Iterator[Doc]:
        size = batch_size or self.batch_size
        batch: list[Doc] = []
        for doc in docs:
            batch.append(doc)
            if len(batch) == size:
                yield from self._annotate(batch)
                batch = []
        if batch:
            yield from self._annotate(batch)

    def _annotate(self, docs: list[Doc]) -> Iterator[Doc]:
        found = self.client.extract([doc.text for doc in docs], self.model, labels=self.labels, options=self.options)
        for doc, entities in zip(docs, found, strict=True):
            pairs = [(self._span(doc, entity), entity) for entity in entities]
            placed = [(span, entity) for span, entity in pairs if span is not None]
            doc.spans[self.spans_key] = [span for span, _ in placed]
            doc.ents = _non_overlapping([span for span, entity in placed if len(entity.spans) == 1])
            yield doc

    @staticmethod
    def _span(doc: Doc, entity: Entity) -> Span | None:
        span = doc.char_span(entity.start, entity.end, label=entity.type, alignment_mode="expand")
        if span is not None:
            span._.nerserve_fragments = [tuple(pair) for pair in entity.spans]
            span._.nerserve_score = entity.score
        return span


def _non_overlapping(spans: list[Span]) -> list[Span]:
    kept: list[Span] = []
    for span in sorted(spans, key=lambda s: (-(s._.nerserve_score or 0.0), s.start)):
        if all(span.end <= other.start or other.end <= span.start for other in kept):
            kept.append(span)
    return sorted(kept, key=lambda s: s.start)


@Language.factory(
    "nerserve",
    default_config={
        "url": "http://127.0.0.1:8000",
        "model": None,
        "labels": None,
        "options": {},
        "spans_key": "nerserve",
        "batch_size": 64,
        "timeout": 60.0,
        "api_key_env": "NERSERVE_API_KEY",
    },
)
def make_nerserve(
    nlp: Language,
    name: str,
    url: str,
    model: str | None,
    labels: list[str] | None,
    options: dict[str, Any],
    spans_key: str,
    batch_size: int,
    timeout: float,
    api_key_env: str | None,
) -> NerServeComponent:
    return NerServeComponent(url, model, labels, options, spans_key, batch_size, timeout, api_key_env)
