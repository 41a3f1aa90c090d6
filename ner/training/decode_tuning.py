"""Choose decoding options on dev: the graphs run once, decoding is repeated over a grid."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from ner.data import Sentence
from ner.evaluation import evaluate
from ner.runner import length_batches
from ner.types import EntitySet

THRESHOLDS = tuple(round(float(x), 2) for x in np.arange(0.3, 0.91, 0.05))
DECODE_GRID: dict[str, Sequence[Any]] = {"threshold": THRESHOLDS[:11], "nms_decay": (0.9, 0.6, 0.3)}
START_THRESHOLDS = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7)
# the decoding options each architecture tunes on dev
GRIDS: dict[str, dict[str, Sequence[Any]]] = {
    "span": DECODE_GRID,
    "nag": {"start_threshold": START_THRESHOLDS, "threshold": (0.0, 0.3, 0.4, 0.5, 0.6)},
    # φ/3: the paper's 2.5/3 ≈ 0.83 (tuned in [2.5, 2.7]); a CPU-trained model is less confident
    "diffusion": {"threshold": tuple(round(float(x), 2) for x in np.arange(0.1, 0.91, 0.05))},
}


def loosest_run(program: Any, grid: dict[str, Sequence[Any]]) -> Any:
    """Options to run the graphs with once for a whole grid: NAG's τ_s selects the decoder's
    queries, and a stricter τ_s only drops some (a query's tokens do not depend on the others)."""
    if "start_threshold" in grid:
        return program.config.decode.replace(start_threshold=max(grid["start_threshold"]))
    return None


def retune_model(name: str, data_dir: Path, batch_size: int = 64) -> dict[str, Any]:
    """Re-choose a trained model's decoding options on dev (span: threshold × Soft-NMS decay;
    nag: τ_s × threshold), then re-score dev, the regression slice and test with them, and
    rewrite its manifest."""
    from dataclasses import asdict

    from ner.data import read_split
    from ner.loading import load_model
    from ner.model_store import read_manifest, write_manifest
    from ner.runner import score

    model = load_model(name)
    program = model.program
    dev = read_split(data_dir, "dev")
    before = float(score(program.predict, dev, batch_size)["f1"])
    grid = GRIDS[model.manifest.architecture]
    best, after, table = tune_decoding(program, dev, batch_size, grid, loosest_run(program, grid))
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
    if hasattr(program, "outcomes"):
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
    program: Any,
    sentences: Sequence[Sentence],
    batch_size: int,
    grid: dict[str, Sequence[Any]],
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
        options = program.config.decode.replace(**dict(zip(names, values, strict=True)))
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
