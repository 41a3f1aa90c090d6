"""Learning curves of the committed models: dev F1 by epoch and by training minute, across every
run a model was warm-started through (training.warm_start.earlier_runs in its manifest), with the
device each run used. Writes docs/learning-curves.png and docs/learning-curves.md.

    python benchmarks/learning_curves.py
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from nerserve.ner.model_store import Locations, read_manifest
from nerserve.ner.training.loop import earlier_runs

# the folders `nerserve` finds when run where this is (NERSERVE_MODEL_STORE, NERSERVE_GRAPH_CACHE, …)
LOCATIONS = Locations()

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


def onnx_test_f1(name: str, reference: Path) -> float | None:
    """Test F1 through ONNX on CPU (what the service delivers), where `nerserve eval --runtime onnx`
    wrote it to docs/reference-run/eval-NAME-onnx.json."""
    path = reference / f"eval-{name}-onnx.json"
    return float(json.loads(path.read_text())["f1"]) if path.is_file() else None


def last_run_gain(runs: list[dict[str, Any]]) -> float | None:
    """Best dev F1 of the last run minus the best before it (its own first epoch for a single run):
    whether the latest compute still paid."""
    scores = [[float(row["dev_f1"]) for row in run.get("history") or []] for run in runs]
    scores = [run for run in scores if run]
    if not scores:
        return None
    earlier = [f for run in scores[:-1] for f in run] or scores[-1][:1]
    return max(scores[-1]) - max(earlier)


def how(run: dict[str, Any]) -> str:
    """A later run's epochs and device, or for a weight average (0 epochs) what it averaged."""
    return f"{run['epochs']} ep, {run['device']}" if run["epochs"] else str(run["device"])


def not_promoted(name: str, runs: list[dict[str, Any]], committed_dev: float) -> str:
    """Later continuations of NAME that were not promoted (docs/reference-run/not-promoted.json):
    whether the curve still rises past the committed model."""
    described = [
        f"{run['run']}: {how(run)}, dev {run['dev']:.4f} ({run['dev'] - committed_dev:+.4f}), test {run['test']:.4f}"
        for run in runs
        if run["model"] == name
    ]
    return "; ".join(described) or "–"


def table_row(name: str, manifest: Any, runs: list[dict[str, Any]], reference: Path, later: list[dict[str, Any]]) -> str:
    described = []
    for run in runs:
        history = run.get("history") or []
        best = max((float(r["dev_f1"]) for r in history), default=float("nan"))
        device = str(run.get("device") or "cpu")
        described.append(f"{len(history)} ep, {float(run.get('minutes') or 0):.0f} min, {device}, best dev {best:.4f}")
    committed_dev = float(manifest.scores.get("dev", {}).get("f1", float("nan")))
    gain = last_run_gain(runs)
    if manifest.training.get("weight_average"):  # the committed weights average the last two runs'
        described.append(f"their weight average, dev {committed_dev:.4f}")
        gain = committed_dev - max(point[2] for point in curve(runs))
    eager = manifest.scores.get("test", {}).get("f1", float("nan"))
    onnx = onnx_test_f1(name, reference)
    served = eager if onnx is None else onnx
    bar = BARS.get(name)
    verdict = "" if bar is None else ("met" if served >= bar else f"short by {bar - served:.4f}")
    bar_text = f"{bar:.2f}" if bar is not None else "–"
    onnx_text = "–" if onnx is None else f"{onnx:.4f}"
    gain_text = "–" if gain is None else f"{gain:+.4f}"
    later_text = not_promoted(name, later, committed_dev)
    cells = ["; ".join(described), gain_text, later_text, f"{eager:.4f}", onnx_text, bar_text, verdict]
    return f"| {name} | " + " | ".join(cells) + " |"


@app.command()
def main(
    out: Annotated[Path, typer.Option(help="folder for the plot and the table")] = Path("docs"),
    reference: Annotated[Path, typer.Option(help="folder of the eval-NAME-onnx.json files")] = Path("docs/reference-run"),
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = LOCATIONS.list_models()
    figure, (by_epoch, by_minute) = plt.subplots(1, 2, figsize=(14, 6))
    rows = []
    listed = reference / "not-promoted.json"
    later = json.loads(listed.read_text())["runs"] if listed.is_file() else []
    colours = [plt.get_cmap("tab20")(i) for i in range(20)]
    for index, name in enumerate(names):
        manifest = read_manifest(LOCATIONS.model_store / name)
        runs = earlier_runs(manifest.training)  # its own run last
        points = curve(runs)
        if not points:
            continue
        line = by_epoch.plot([p[0] for p in points], [p[2] for p in points], label=name, color=colours[index % 20])[0]
        by_minute.plot([p[1] for p in points], [p[2] for p in points], color=line.get_color())
        gpu = [p for p in points if p[3] == "cuda"]
        by_epoch.scatter([p[0] for p in gpu], [p[2] for p in gpu], color=line.get_color(), marker="^", s=18)
        by_minute.scatter([p[1] for p in gpu], [p[2] for p in gpu], color=line.get_color(), marker="^", s=18)
        rows.append(table_row(name, manifest, runs, reference, later))
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
        "Last run's gain: its best dev F1 minus the best before it (or the weight average's, where the",
        "committed weights average the last two runs). Later runs: continuations trained to the end",
        "but not promoted (docs/reference-run/not-promoted.json), dev F1 against the committed model's (a tie,",
        "under 0.001, or lower): together, whether more compute of the same recipe would still help.",
        "Test F1 eager: scored when the run ended (on its device); through ONNX: `nerserve eval --runtime onnx`",
        "on CPU (docs/reference-run/eval-NAME-onnx.json), what the service delivers; the bar is judged on it.",
        "",
        "| model | runs (epochs, minutes, device, best dev F1) | last run's gain | later runs, not promoted "
        "| test F1 eager | test F1 ONNX | bar | |",
        "|---|---|---:|---|---:|---:|---:|---|",
    ]
    (out / "learning-curves.md").write_text("\n".join(header + rows) + "\n")
    typer.echo(f"wrote {out / 'learning-curves.png'} and {out / 'learning-curves.md'}")


if __name__ == "__main__":
    app()
