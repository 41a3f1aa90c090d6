"""GNER's tables on this machine, through the exported ONNX graphs (tokenise → graphs → decode):

- Table 4: sentences/s of gner (greedy and beam 4) beside span, nag, setgen and bartner on the
  same test sentences, with each one's strict F1 on them;
- Table 5: the Hunt–Szymanski LCS against the O(n·m) table on the (input words, generated words)
  pairs of gner's free generation, by sentence-length bucket;
- Table 6: F1 of the same free generation with the full hierarchical matching, without
  back-tokenisation, without LCS; and of constrained decoding.

    python benchmarks/gner_tables.py --model gner-open --data ../shared/data/conll03 --limit 1000 \
        --json-out docs/reference-run/gner-tables.json
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer

from nerserve.ner.archs.gner.matching import lcs_hunt_szymanski, lcs_table
from nerserve.ner.archs.gner.tagging import parse_pairs, squeeze
from nerserve.ner.data import Sentence, named_split, read_split
from nerserve.ner.evaluation import evaluate
from nerserve.ner.model_store import Locations
from nerserve.ner.runner import length_batches
from nerserve.ner.runtime.graph_set import load_graph_set
from nerserve.ner.types import EntitySet

# the folders `nerserve` finds when run where this is (NERSERVE_MODEL_STORE, NERSERVE_GRAPH_CACHE, …)
LOCATIONS = Locations()

app = typer.Typer(add_completion=False)
BUCKETS = ((1, 10), (11, 20), (21, 30), (31, 50), (51, 10_000))


def timed_predictions(program: Any, sentences: list[Sentence], options: Any, batch_size: int) -> tuple[list[EntitySet], float]:
    """Predictions in input order, batches in arrival order (as a server receives them)."""
    predictions: list[EntitySet] = []
    program.predict([list(sentences[0].tokens)], options)  # warm-up
    started = time.perf_counter()
    for i in range(0, len(sentences), batch_size):
        predictions += program.predict([list(s.tokens) for s in sentences[i : i + batch_size]], options)
    return predictions, time.perf_counter() - started


def f1_of(sentences: list[Sentence], predictions: list[EntitySet]) -> float:
    return float(evaluate((s.entities, p) for s, p in zip(sentences, predictions, strict=True))["f1"])


def speed_table(models: list[str], gner: str, data: Path, limit: int, batch_size: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    closed = read_split(data, "test", limit)
    named, labels = named_split(data, "test", limit)
    for model in [*models, gner, gner]:
        program = load_graph_set(LOCATIONS.graph_set_folder(model, "onnx")).program
        options = program.config.decode
        sentences = closed
        if model == gner:
            beams = 4 if any(r["model"] == gner for r in rows) else 1
            options = dataclasses.replace(options, labels=labels, beams=beams, constrained=True)
            sentences = named
        predictions, seconds = timed_predictions(program, sentences, options, batch_size)
        row = {"model": model, "beams": getattr(options, "beams", None), "sentences": len(sentences)}
        rows.append({**row, "sentences_per_second": len(sentences) / seconds, "f1": f1_of(sentences, predictions)})
        typer.echo(f"table 4: {rows[-1]}", err=True)
    reference = next(r["sentences_per_second"] for r in rows if r["model"] == gner)
    for row in rows:
        row["vs_gner_greedy"] = row["sentences_per_second"] / reference
    return rows


def free_generation(program: Any, sentences: list[Sentence], labels: tuple[str, ...], batch_size: int) -> list[dict[str, Any]]:
    """Each sentence's free (unconstrained, greedy) output tokens."""
    options = dataclasses.replace(program.config.decode, labels=labels, beams=1, constrained=False)
    written: list[dict[str, Any]] = [{}] * len(sentences)
    for batch_indices in length_batches([len(s.tokens) for s in sentences], batch_size):
        batch = program.prepare([list(sentences[i].tokens) for i in batch_indices])
        outputs = program.run(batch, options)
        for row, index in enumerate(batch_indices):
            kept = outputs["sequence_tokens"][row] >= 0
            written[index] = {
                "sentence": batch.sentences[row],
                "tokens": outputs["sequence_tokens"][row][kept].tolist(),
                "log_probs": outputs["sequence_log_probs"][row][kept].tolist(),
            }
    return written


def matching_table(program: Any, written: list[dict[str, Any]], repeats: int) -> list[dict[str, Any]]:
    tokenizer = program.subwords.tokenizer
    pairs_by_bucket: dict[tuple[int, int], list[tuple[list[str], list[str]]]] = {b: [] for b in BUCKETS}
    for item in written:
        sentence = item["sentence"]
        words = [squeeze(tokenizer.decode(list(p))) for p in sentence.pieces]
        generated = [squeeze(w) for w, _ in parse_pairs(tokenizer.decode(item["tokens"]))]
        bucket = next(b for b in BUCKETS if b[0] <= len(words) <= b[1])
        pairs_by_bucket[bucket].append((words, generated))
    rows = []
    for (low, high), pairs in pairs_by_bucket.items():
        if not pairs:
            continue
        seconds = {}
        for name, function in (("dp", lcs_table), ("hunt_szymanski", lcs_hunt_szymanski)):
            started = time.perf_counter()
            for _ in range(repeats):
                for words, generated in pairs:
                    function(words, generated)
            seconds[name] = (time.perf_counter() - started) / (repeats * len(pairs))
        rows.append(
            {
                "words": f"{low}-{high}" if high < 10_000 else f"{low}+",
                "sentences": len(pairs),
                "dp_microseconds": seconds["dp"] * 1e6,
                "hunt_szymanski_microseconds": seconds["hunt_szymanski"] * 1e6,
                "speedup": seconds["dp"] / seconds["hunt_szymanski"],
            }
        )
        typer.echo(f"table 5: {rows[-1]}", err=True)
    return rows


def ablation_table(
    program: Any, sentences: list[Sentence], written: list[dict[str, Any]], labels: tuple[str, ...], batch_size: int
) -> list[dict[str, Any]]:
    rows = []
    for name, back_tokenise, use_lcs in (
        ("free generation, hierarchical matching", True, True),
        ("free generation, without back-tokenisation", False, True),
        ("free generation, without LCS", True, False),
    ):
        tiers: dict[str, int] = {}
        predictions = []
        for item in written:
            entities, tier = program.structure(
                item["sentence"], item["tokens"], item["log_probs"], labels, back_tokenise, use_lcs
            )
            tiers[tier] = tiers.get(tier, 0) + 1
            predictions.append(EntitySet(entities))
        rows.append({"decoding": name, "f1": f1_of(sentences, predictions), "tiers": tiers})
        typer.echo(f"table 6: {rows[-1]}", err=True)
    options = dataclasses.replace(program.config.decode, labels=labels, beams=1, constrained=True)
    predictions, _ = timed_predictions(program, sentences, options, batch_size)
    rows.append({"decoding": "constrained (words forced, tags from the request)", "f1": f1_of(sentences, predictions)})
    typer.echo(f"table 6: {rows[-1]}", err=True)
    return rows


@app.command()
def main(
    model: Annotated[str, typer.Option()] = "gner-open",
    data: Annotated[Path, typer.Option()] = Path("../shared/data/conll03"),
    others: Annotated[str, typer.Option(help="comma-separated models of Table 4")] = (
        "span-conll03,nag-conll03,setgen-conll03,bartner-conll03"
    ),
    limit: Annotated[int, typer.Option(min=10)] = 1000,
    batch_size: Annotated[int, typer.Option(min=1)] = 32,
    repeats: Annotated[int, typer.Option(min=1)] = 5,
    tables: Annotated[str, typer.Option(help="which of 4,5,6")] = "4,5,6",
    json_out: Annotated[Path | None, typer.Option()] = None,
) -> None:
    chosen = set(tables.split(","))
    result: dict[str, Any] = {"model": model, "data": str(data), "limit": limit, "batch_size": batch_size}
    if "4" in chosen:
        result["table4"] = speed_table([m for m in others.split(",") if m], model, data, limit, batch_size)
    if chosen & {"5", "6"}:
        program = load_graph_set(LOCATIONS.graph_set_folder(model, "onnx")).program
        sentences, labels = named_split(data, "test", limit)
        written = free_generation(program, sentences, labels, batch_size)
        result["free_generation_outcomes"] = {"finished": int(np.sum([bool(w["tokens"]) for w in written]))}
        if "5" in chosen:
            result["table5"] = matching_table(program, written, repeats)
        if "6" in chosen:
            result["table6"] = ablation_table(program, sentences, written, labels, batch_size)
    text = json.dumps(result, indent=2)
    if json_out:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(text)
    typer.echo(text)


if __name__ == "__main__":
    app()
