"""Raw text against pre-tokenised input, on text made from a dev split: each document is
`--per-document` consecutive sentences, each sentence detokenised (Moses, sacremoses). With
`--layout lines` (the default) a sentence that ends in . ! ? (or a closing quote after one) is
followed by a space and any other by a line break, as the news text the corpus was cut from lays
out its headlines, bylines, datelines and results tables; `--layout spaces` puts every sentence on
one line, headlines included (a harder text than a news article is). The service's own pipeline
(sentence splitting, word tokenisation, windowing, assembly) reads the documents; the
pre-tokenised sentences go through the same model. Reported: sentence boundaries recovered
(precision / recall of the splitter's boundaries against the true ones), and strict entity F1 by
character offsets from `texts` and from `tokens`. `--written` changes every word's characters, in
the documents and the tokens alike: `NFD` decomposed (an accented letter as its base and a combining
mark, as macOS file names and some PDF text write it), `soft-hyphens` with a soft hyphen in the
middle of every word of six letters or more (as HTML's &shy; hyphenates long words), `bidi-isolated`
with every capitalised word between a first-strong isolate and its pop (U+2068 … U+2069, as text
copied from a page's <bdi> or a tweet's user names carries them). Gold offsets leave out the
invisible characters at an entity's edges. `--suffixes attached` writes a token that begins with a
hyphen and a letter onto the word before it, as the text it was cut from had it (GENIA's "IL-2
-induced" was "IL-2-induced" in its abstract; Moses leaves the space). An open-label model is asked
for the data's label names.

    python benchmarks/raw_text_eval.py --model span-conll03 --data ../shared/data/conll03
    python benchmarks/raw_text_eval.py --model gliner-open --data ../shared/data/open/wikiann_en --written NFD
"""

from __future__ import annotations

import dataclasses
import json
import re
import unicodedata
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

import typer
from sacremoses import MosesDetokenizer

from nerserve.ner.archs.registry import architecture
from nerserve.ner.data import Sentence, named_split, read_split
from nerserve.ner.evaluation import evaluate
from nerserve.ner.model_store import Locations
from nerserve.ner.runtime.graph_set import load_graph_set
from nerserve.ner.text.segment import PLAIN_WORDS, is_invisible
from nerserve.ner.types import Entity, EntitySet
from nerserve.service.pipeline import Planner, assemble

# the folders `nerserve` finds when run where this is (NERSERVE_MODEL_STORE, NERSERVE_GRAPH_CACHE, …)
LOCATIONS = Locations()

app = typer.Typer(add_completion=False)


def soft_hyphenated(word: str) -> str:
    return f"{word[: len(word) // 2]}\u00ad{word[len(word) // 2 :]}" if len(word) >= 6 and word.isalpha() else word


def bidi_isolated(word: str) -> str:
    return f"\u2068{word}\u2069" if word[:1].isupper() else word


Written = Literal["as-is", "NFD", "soft-hyphens", "bidi-isolated"]
WRITTEN: dict[str, Callable[[str], str]] = {
    "as-is": lambda word: word,
    "NFD": lambda word: unicodedata.normalize("NFD", word),
    "soft-hyphens": soft_hyphenated,
    "bidi-isolated": bidi_isolated,
}


def visible(text: str, start: int, end: int) -> tuple[int, int]:
    """[START, END) without the invisible characters at its edges."""
    while start < end and is_invisible(text[start]):
        start += 1
    while end > start and is_invisible(text[end - 1]):
        end -= 1
    return start, end


def token_offsets(text: str, tokens: tuple[str, ...]) -> list[tuple[int, int]]:
    """Each token's [start, end) in its detokenised text (tokens appear in order, verbatim)."""
    spans, cursor = [], 0
    for token in tokens:
        start = text.index(token, cursor)
        spans.append((start, start + len(token)))
        cursor = start + len(token)
    return spans


def separator(tokens: tuple[str, ...], layout: str) -> str:
    """What follows a sentence in the made-up document."""
    if layout == "spaces":
        return " "
    final = {".", "!", "?"}
    ends = tokens[-1] in final or (len(tokens) > 1 and tokens[-1] in {'"', "'", ")"} and tokens[-2] in final)
    return " " if ends else "\n"


_SPLIT_SUFFIX = re.compile(r" (?=-[^\W\d_])")


def documents(
    sentences: list[Sentence], per_document: int, layout: str, suffixes: str = "apart"
) -> list[tuple[str, EntitySet, list[int]]]:
    """(text, gold entities by character offsets, the offsets where a true sentence starts)."""
    detokenizer = MosesDetokenizer(lang="en")
    out = []
    for i in range(0, len(sentences), per_document):
        text, gold, starts = "", [], []
        after = ""
        for sentence in sentences[i : i + per_document]:
            piece = detokenizer.detokenize(list(sentence.tokens))
            if suffixes == "attached":
                piece = _SPLIT_SUFFIX.sub("", piece)
            offset = len(text) + len(after)
            text = f"{text}{after}{piece}"
            after = separator(sentence.tokens, layout)
            starts.append(visible(text, offset, len(text))[0])
            spans = token_offsets(piece, sentence.tokens)
            for entity in sentence.entities:
                chars = tuple(visible(text, offset + spans[s][0], offset + spans[e - 1][1]) for s, e in entity.fragments)
                gold.append(Entity(entity.type, chars))
        out.append((text, EntitySet(gold), starts))
    return out


def run_texts(
    program: Any, planner: Planner, texts: list[str] | None, tokens: list[list[str]] | None, options: Any = None
) -> list[list[dict[str, Any]]]:
    planned = planner.plan(texts, tokens)
    units = [unit for text in planned for unit in text.units]
    results = []
    for i in range(0, len(units), 32):
        batch = units[i : i + 32]
        results += program.predict([u.sentence for u in batch], options)
    by_text: list[list[EntitySet]] = [[] for _ in planned]
    for unit, result in zip(units, results, strict=True):
        by_text[unit.text_index].append(result)
    return [assemble(text, by_text[i]) for i, text in enumerate(planned)]


def as_set(found: list[dict[str, Any]], shift: int = 0) -> EntitySet:
    return EntitySet(Entity(e["type"], tuple((a + shift, b + shift) for a, b in e["spans"])) for e in found)


@app.command()
def main(
    model: Annotated[str, typer.Option()] = "span-conll03",
    data: Annotated[Path, typer.Option()] = Path("../shared/data/conll03"),
    split: Annotated[str, typer.Option()] = "dev",
    per_document: Annotated[int, typer.Option(min=1)] = 5,
    layout: Annotated[str, typer.Option(help="lines (news layout) or spaces (every sentence on one line)")] = "lines",
    limit: Annotated[int | None, typer.Option(min=1)] = None,
    written: Annotated[Written, typer.Option(help="every word's characters as they are, or changed (above)")] = "as-is",
    suffixes: Annotated[
        Literal["apart", "attached"], typer.Option(help="a token beginning with a hyphen: apart, or on the word before")
    ] = "apart",
    plain_words: Annotated[
        bool, typer.Option(help="words cut in the plain style, not as the model's manifest says its data writes them")
    ] = False,
) -> None:
    loaded = load_graph_set(LOCATIONS.graph_set_folder(model, "onnx"))
    program = loaded.program
    words = PLAIN_WORDS if plain_words else loaded.manifest.words
    planner = Planner(program.subwords, 384, 24, words)
    spec = architecture(loaded.manifest.architecture)
    sentences, labels = (
        named_split(data, split, limit) if spec.capabilities.open_labels else (read_split(data, split, limit), ())
    )
    options = spec.request_options(program.config.decode, {}, labels)
    sentences = [dataclasses.replace(s, tokens=tuple(map(WRITTEN[written], s.tokens))) for s in sentences]
    docs = documents(sentences, per_document, layout, suffixes)
    from_texts = run_texts(program, planner, [text for text, _, _ in docs], None, options)
    true_boundaries = predicted_boundaries = recovered = 0
    planned = planner.plan([text for text, _, _ in docs])
    for (_, _, starts), plan in zip(docs, planned, strict=True):
        unit_starts = {plan.words[u.word_offset].start for u in plan.units if u.word_offset > 0}
        true = set(starts[1:])
        true_boundaries += len(true)
        predicted_boundaries += len(unit_starts)
        recovered += len(true & unit_starts)
    texts_report = evaluate((gold, as_set(found)) for (_, gold, _), found in zip(docs, from_texts, strict=True))
    # the same sentences pre-tokenised: offsets index the tokens joined by single spaces, so score by token spans
    from_tokens = run_texts(program, planner, None, [list(s.tokens) for s in sentences], options)
    tokens_report = evaluate(
        (s.entities, EntitySet(Entity(e["type"], tuple(tuple(f) for f in e["token_spans"])) for e in found))
        for s, found in zip(sentences, from_tokens, strict=True)
    )
    summary = {
        "model": model,
        "data": f"{data}/{split}",
        "layout": layout,
        "written": written,
        "suffixes": suffixes,
        "words": words.model_dump(),
        "documents": len(docs),
        "sentences": len(sentences),
        "boundaries": {
            "true": true_boundaries,
            "predicted": predicted_boundaries,
            "recovered": recovered,
            "precision": recovered / predicted_boundaries if predicted_boundaries else 0.0,
            "recall": recovered / true_boundaries if true_boundaries else 0.0,
        },
        "f1_from_texts": texts_report["f1"],
        "f1_from_tokens": tokens_report["f1"],
        "difference_points": 100 * (tokens_report["f1"] - texts_report["f1"]),
    }
    typer.echo(json.dumps(summary, indent=2))


if __name__ == "__main__":
    app()
