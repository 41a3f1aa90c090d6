"""Learning curves of the committed models: dev F1 by epoch and by training minute, across every
run a model was warm-started through (training.warm_start.earlier_runs in its manifest), with the
device each run used. Writes docs/learning-curves.png and docs/learning-curves.md.

    python benchmarks/learning_curves.py
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from nerserve.ner.model_store import list_models, model_store_root, read_manifest
from nerserve.ner.training.loop import earlier_runs

app = typer.Typer(add_completion=False)

# test-F1 bars of the accuracy issue (and of the setgen/bartner issue for the pointer models)
BARS = {
    "span-conll03": 0.90,
    "span-genia": 0.74,
    "nag-conll03": 0.89,
    "nag-genia": 0.72,
    "nag-cadec": 0.65,
    "diffusion-conll03": 0.88,
    "diffusion-genia": 0.74,
    "setgen-conll03": 0.88,
    "setgen-genia": 0.72,
    "setgen-cadec": 0.65,
    "bartner-conll03": 0.85,
}


def curve(runs: list[dict[str, Any]]) -> list[tuple[int, float, float, str]]:
    """(epoch, minute, dev F1, device) across runs, epochs and minutes counted on from run to run."""
    points: list[tuple[int, float, float, str]] = []
    epochs, minutes = 0, 0.0
    for run in runs:
        device = str(run.get("device") or "cpu").split(" ")[0]
        for row in run.get("history") or []:
            points.append((epochs + int(row["epoch"]), minutes + float(row["minutes"]), float(row["dev_f1"]), device))
        epochs += len(run.get("history") or [])
        minutes += float(run.get("minutes") or 0.0)
    return points


def table_row(name: str, manifest: Any, runs: list[dict[str, Any]]) -> str:
    described = []
    for run in runs:
        history = run.get("history") or []
        best = max((float(r["dev_f1"]) for r in history), default=float("nan"))
        device = str(run.get("device") or "cpu")
        described.append(f"{len(history)} ep, {float(run.get('minutes') or 0):.0f} min, {device}, best dev {best:.4f}")
    test = manifest.scores.get("test", {}).get("f1", float("nan"))
    bar = BARS.get(name)
    verdict = "" if bar is None else ("met" if test >= bar else f"short by {bar - test:.4f}")
    bar_text = f"{bar:.2f}" if bar is not None else "–"
    return f"| {name} | {'; '.join(described)} | {test:.4f} | {bar_text} | {verdict} |"


@app.command()
def main(out: Annotated[Path, typer.Option(help="folder for the plot and the table")] = Path("docs")) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list_models()
    figure, (by_epoch, by_minute) = plt.subplots(1, 2, figsize=(14, 6))
    rows = []
    colours = [plt.get_cmap("tab20")(i) for i in range(20)]
    for index, name in enumerate(names):
        manifest = read_manifest(model_store_root() / name)
        runs = earlier_runs(manifest.training)  # its own run last
        points = curve(runs)
        if not points:
            continue
        line = by_epoch.plot([p[0] for p in points], [p[2] for p in points], label=name, color=colours[index % 20])[0]
        by_minute.plot([p[1] for p in points], [p[2] for p in points], color=line.get_color())
        gpu = [p for p in points if p[3] == "cuda"]
        by_epoch.scatter([p[0] for p in gpu], [p[2] for p in gpu], color=line.get_color(), marker="^", s=18)
        by_minute.scatter([p[1] for p in gpu], [p[2] for p in gpu], color=line.get_color(), marker="^", s=18)
        rows.append(table_row(name, manifest, runs))
    by_epoch.set(xlabel="epoch (all runs)", ylabel="dev F1", title="dev F1 by epoch (▲ = epoch trained on a GPU)")
    by_minute.set(xlabel="training minutes (all runs, CPU and GPU minutes alike)", title="dev F1 by minute")
    by_minute.set_xscale("log")
    by_epoch.legend(fontsize=7, ncol=2)
    figure.tight_layout()
    figure.savefig(out / "learning-curves.png", dpi=110)
    header = [
        "# Learning curves of the committed models",
        "",
        "Written by `python benchmarks/learning_curves.py` from the manifests (each warm-started model keeps",
        "the runs it continued in `training.warm_start.earlier_runs`). ![curves](learning-curves.png)",
        "",
        "| model | runs (epochs, minutes, device, best dev F1) | test F1 | bar | |",
        "|---|---|---:|---:|---|",
    ]
    (out / "learning-curves.md").write_text("\n".join(header + rows) + "\n")
    typer.echo(f"wrote {out / 'learning-curves.png'} and {out / 'learning-curves.md'}")


if __name__ == "__main__":
    app()
