"""What an open-label model answers to label lists a user would try (synonyms, multi-word names,
names no training set has), through a running nerserve, as a markdown table.

    nerserve serve --models gliner-open,gner-open --port 8031 &
    python benchmarks/open_label_examples.py --url http://127.0.0.1:8031 --out docs/open-label-examples.md
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from nerserve.client import Client

app = typer.Typer(add_completion=False)

EXAMPLES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("I took ibuprofen for my migraine and it gave me a stomach ache.", ("drug", "disease", "symptom")),
    ("I took ibuprofen for my migraine and it gave me a stomach ache.", ("medication", "illness", "side effect")),
    ("Steven Spielberg directed Jurassic Park starring Sam Neill.", ("movie", "actor", "director")),
    ("Steven Spielberg directed Jurassic Park starring Sam Neill.", ("film", "film director", "person")),
    ("The patient was given 5 mg of warfarin after the hip replacement.", ("drug", "dosage", "medical procedure")),
    ("Apple opened a new store on Fifth Avenue in New York last Friday.", ("company", "street", "city", "date")),
    ("Lionel Messi scored twice as Inter Miami beat Orlando City 3-1.", ("athlete", "sports team", "score")),
    ("The BRCA1 gene is mutated in many hereditary breast cancers.", ("gene", "cancer")),
    ("Flooding closed Interstate 10 near the Buffalo Bayou in Houston.", ("road", "river", "city")),
    (
        "The turbine blades were made of titanium alloy by selective laser melting.",
        ("material", "manufacturing process", "machine or equipment"),
    ),
    ("Book a table for two at an Italian restaurant near Union Square tonight.", ("cuisine", "location", "time", "party size")),
    # typed as queries and tweets are: no capitals, user mentions
    ("show me movies directed by steven spielberg starring tom hanks", ("director", "actor", "movie")),
    ("any cheap italian places near union square open after midnight", ("cuisine", "price", "location", "hours")),
    ("great effort from @GWS_Giants tonight, congrats @colgo and the team in sydney", ("person", "organization", "location")),
)


def cell(entities: list[tuple[str, str, float]]) -> str:
    return "; ".join(f"{text} → *{label}* ({score:.2f})" for text, label, score in entities) or "(nothing)"


@app.command()
def main(
    url: Annotated[str, typer.Option()] = "http://127.0.0.1:8000",
    models: Annotated[str, typer.Option(help="comma-separated open-label models, a column each")] = "gliner-open,gner-open",
    out: Annotated[Path | None, typer.Option()] = None,
) -> None:
    names = models.split(",")
    lines = ["| text | labels asked | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    with Client(url, timeout=120) as client:
        for text, labels in EXAMPLES:
            cells = []
            for model in names:
                found = client.extract([text], model, labels=list(labels))[0]
                cells.append(cell([(e.text, e.type, e.score) for e in found]))
            lines.append(f"| {text} | {', '.join(labels)} | " + " | ".join(cells) + " |")
    table = "\n".join(lines) + "\n"
    typer.echo(table)
    if out:
        out.write_text(table)


if __name__ == "__main__":
    app()
