"""A model on a test split whose words are written in styled Unicode: fullwidth forms (ＡＢＣ, １２３,
common in CJK text) and mathematical bold (𝐀𝐁𝐂, 𝟏𝟐𝟑: styled names in social media). Their plain
letters and digits are in the backbone's vocabulary; the styled ones are not, and reach the model
only through the tokenizer's NFKC reading of a word it does not know (ner/text/subword.py).
Reported: strict F1 through the exported graphs on the plain split and on each styled one (gold
entities unchanged: only the characters of the words change, never their number).

    python benchmarks/styled_text_eval.py --model span-conll03 --data ../shared/data/conll03
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from nerserve.ner.data import read_split
from nerserve.ner.model_store import Locations
from nerserve.ner.runner import score
from nerserve.ner.runtime.graph_set import load_graph_set

LOCATIONS = Locations()

app = typer.Typer(add_completion=False)


def fullwidth(word: str) -> str:
    """Every printable ASCII character but the space as its fullwidth form (U+FF01 to U+FF5E)."""
    return "".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else c for c in word)


def bold(word: str) -> str:
    """Latin letters and digits in mathematical bold (U+1D400, U+1D41A, U+1D7CE); the rest as is."""
    return "".join(_bold(c) for c in word)


def _bold(char: str) -> str:
    for first, start in (("A", 0x1D400), ("a", 0x1D41A), ("0", 0x1D7CE)):
        offset = ord(char) - ord(first)
        if 0 <= offset < (10 if first == "0" else 26):
            return chr(start + offset)
    return char


STYLES: dict[str, Callable[[str], str]] = {"plain": lambda word: word, "fullwidth": fullwidth, "bold": bold}


@app.command()
def main(
    model: Annotated[str, typer.Option()] = "span-conll03",
    data: Annotated[Path, typer.Option()] = Path("../shared/data/conll03"),
    split: Annotated[str, typer.Option()] = "test",
    threads: Annotated[int | None, typer.Option(min=1)] = None,
) -> None:
    program = load_graph_set(LOCATIONS.graph_set_folder(model, "onnx", False), threads=threads).program
    sentences = read_split(data, split)
    rows = {}
    for name, style in STYLES.items():
        styled = [dataclasses.replace(s, tokens=tuple(map(style, s.tokens))) for s in sentences]
        report = score(program.predict, styled, batch_size=32)
        rows[name] = {key: round(report[key], 4) for key in ("precision", "recall", "f1")}
    typer.echo(json.dumps({"model": model, "data": str(data), "split": split, "sentences": len(sentences), "f1": rows}))


if __name__ == "__main__":
    app()
