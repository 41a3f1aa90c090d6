"""Choose decoding options on dev: the graphs run once, decoding is repeated over a grid."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np

from nerserve.ner.archs.base import ArchitectureSpec, ProgramBase
from nerserve.ner.data import Sentence
from nerserve.ner.evaluation import evaluate
from nerserve.ner.runner import length_batches
from nerserve.ner.types import EntitySet


def tune_spec(
    program: ProgramBase[Any, Any, Any], spec: ArchitectureSpec[Any, Any], sentences: Sequence[Sentence], batch_size: int
) -> tuple[Any, float, list[dict[str, Any]]]:
    """The architecture's own grid (ArchitectureSpec.tuning), graphs run once."""
    tuning = spec.tuning
    run_options = tuning.run_options(program.config.decode, tuning.grid) if tuning.run_options else None
    return tune_decoding(program, sentences, batch_size, tuning.grid, run_options)


def retune_model(folder: Path, data_dir: Path, batch_size: int = 64) -> dict[str, Any]:
    """Re-choose a trained model's decoding options on dev (the architecture's tuning grid), then
    re-score dev, the regression slice and test with them, and rewrite its manifest."""
    from nerserve.ner.data import read_split
    from nerserve.ner.loading import load_model
    from nerserve.ner.model_store import read_manifest, write_manifest
    from nerserve.ner.runner import score

    model = load_model(folder)
    program = model.program
    dev = read_split(data_dir, "dev")
    before = float(score(program.predict, dev, batch_size)["f1"])
    grid = model.spec.tuning.grid
    best, after, table = tune_spec(program, model.spec, dev, batch_size)
    top = sorted(table, key=lambda row: -row["f1"])[:5]
    program.config = replace(program.config, decode=best)
    manifest = read_manifest(model.folder)
    manifest.config["decode"] = asdict(best)
    keep = ("precision", "recall", "f1", "sentences")  # throughput belongs to `nerserve eval` on an idle machine
    test = score(program.predict, read_split(data_dir, "test"), batch_size)
    dev_slice = score(program.predict, dev[:300], batch_size)
    manifest.scores["dev"] = {k: v for k, v in score(program.predict, dev, batch_size).items() if k in keep}
    manifest.scores["dev_slice"] = {"f1": dev_slice["f1"], "sentences": dev_slice["sentences"]}
    manifest.scores["test"] = {k: test[k] for k in keep} | {k: test[k] for k in ("nested", "discontinuous")}
    if program.outcomes:  # generative decoders: how sequences ended on test, drops included
        program.outcomes.clear()
        score(program.predict, read_split(data_dir, "test"), batch_size)
        manifest.scores["decoder_outcomes"] = dict(program.outcomes)
    manifest.training["decode_tuning"] = {
        "grid": {k: list(v) for k, v in grid.items()},
        "dev_f1_before": before,
        "dev_f1_after": after,
        "chosen": asdict(best),
        "best_points": top,
    }
    write_manifest(model.folder, manifest)
    return {"dev_f1_before": before, "dev_f1_after": after, "chosen": asdict(best), "test": manifest.scores["test"]}


def tune_decoding(
    program: ProgramBase[Any, Any, Any],
    sentences: Sequence[Sentence],
    batch_size: int,
    grid: Mapping[str, Sequence[Any]],
    run_options: Any = None,
) -> tuple[Any, float, list[dict[str, Any]]]:
    """The grid point with the best strict F1 on `sentences`, its F1, and every point's F1. The
    graphs run once (with `run_options`, which must not exclude any grid point's results)."""
    runs: list[tuple[list[int], Any, dict[str, np.ndarray]]] = []
    for indices in length_batches([len(s.tokens) for s in sentences], batch_size):
        batch = program.prepare([list(sentences[i].tokens) for i in indices])
        runs.append((indices, batch, program.run(batch, run_options)))
    names = list(grid)
    best, best_f1, table = program.config.decode, -1.0, []
    for values in itertools.product(*(grid[n] for n in names)):
        options = replace(program.config.decode, **dict(zip(names, values, strict=True)))
        pairs: list[tuple[EntitySet, EntitySet]] = []
        for indices, batch, outputs in runs:
            decoded = program.decode(batch, outputs, options)
            pairs += [(sentences[i].entities, p) for i, p in zip(indices, decoded, strict=True)]
        report: dict[str, Any] = evaluate(pairs)  # type: ignore[arg-type]
        f1 = float(report["f1"])
        point = {"precision": float(report["precision"]), "recall": float(report["recall"]), "f1": f1}
        table.append({**dict(zip(names, values, strict=True)), **point})
        if f1 > best_f1:
            best, best_f1 = options, f1
    return best, best_f1, table
