"""The engine issue's ratios from one gpu_check.sh folder: what the model path reaches of the bare
encoder, what the service reaches of the model path, the latency bounds, setgen over bartner, and
half precision's gate; each next to its bar. Missing steps are reported as missing, never as zero.

    python benchmarks/gpu_summary.py --folder build/gpu-check
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

app = typer.Typer(add_completion=False)


def _read(folder: Path, name: str) -> Any:
    """The last JSON line of a step's output, or None when the step wrote none."""
    path = folder / f"{name}.json"
    lines = [line for line in path.read_text().splitlines() if line.startswith("{")] if path.is_file() else []
    return json.loads(lines[-1]) if lines else None


def _lines(folder: Path, name: str) -> list[Any]:
    path = folder / f"{name}.json"
    return [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")] if path.is_file() else []


def _offline_best(folder: Path, *steps: str) -> dict[str, Any] | None:
    """The best length-sorted row over these offline steps' rows."""
    rows: list[dict[str, Any]] = []
    for name in steps:
        report = _read(folder, name)
        rows += report["rows"] if report else []
    if not rows:
        return None
    best = max(rows, key=lambda r: r["length_sorted"])
    return {
        "sentences_per_second_sorted": round(best["length_sorted"], 1),
        "batch_size": best["batch_size"],
        "by_batch": {r["batch_size"]: [round(r["length_sorted"], 1), round(r["arrival_order"], 1)] for r in rows},
    }


def _offline_steps(model: str) -> tuple[str, str]:
    """gpu_check.sh's offline steps of a model: batch 1 on fewer sentences, then the larger batches."""
    return f"offline-{model}-batch1", f"offline-{model}"


def _level(folder: Path, name: str, concurrency: int) -> dict[str, Any] | None:
    report = _read(folder, f"served-{name}")
    for row in report["levels"] if report else []:
        if row["concurrency"] == concurrency:
            return {**row, "client_ceiling_requests_per_second": report["client_ceiling_requests_per_second"]}
    return None


def _rate(row: dict[str, Any] | None) -> float | None:
    return float(row["sentences_per_second"]) if row else None


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    return round(numerator / denominator, 4) if numerator is not None and denominator else None


def _bar(value: float | None, bar: float, at_most: bool = False) -> dict[str, Any]:
    met = None if value is None else (value <= bar if at_most else value >= bar)
    return {"value": value, "bar": f"{'<=' if at_most else '>='} {bar}", "met": met}


PASS_ANATOMY_STEPS = (
    ("eager", "pass-anatomy"),
    ("eager-graph-process", "pass-anatomy-graph-process"),
    ("eager-traced-heads", "pass-anatomy-traced"),
    ("torchscript", "pass-anatomy-torchscript"),
)


def summary(folder: Path) -> dict[str, Any]:
    bare = _read(folder, "bare-encoder")
    bare_best = bare["best"].get("fp32") if bare else None
    span = _offline_best(folder, *_offline_steps("span-conll03"))
    replayed = _offline_best(folder, *_offline_steps("span-conll03-cuda-graphs"))
    # the served bars divide by the best the program reaches offline, with CUDA graphs or without
    span_best = max((run["sentences_per_second_sorted"] for run in (span, replayed) if run), default=None)
    # half precision's served figures divide by its own offline best
    half = _offline_best(folder, *_offline_steps("span-conll03-half"))
    half_best = half["sentences_per_second_sorted"] if half else None
    two_lanes = _offline_best(folder, "offline-span-conll03-lanes2")
    setgen, bartner = _level(folder, "setgen-conll03", 64), _level(folder, "bartner-conll03", 64)
    return {
        "environment": (folder / "environment.txt").read_text() if (folder / "environment.txt").is_file() else None,
        "bare_encoder": bare,
        "offline": {
            model: _offline_best(folder, *_offline_steps(model))
            for model in (
                "span-conll03",
                "span-conll03-cuda-graphs",
                "span-conll03-half",
                "nag-conll03",
                "setgen-conll03",
                "bartner-conll03",
                "diffusion-conll03",
            )
        },
        "offline_span_two_lanes": two_lanes,
        "offline_onnx_span": (_read(folder, "offline-onnx-span-conll03") or {}).get("rows"),
        "offline_torchscript_span": (_read(folder, "offline-torchscript-span-conll03") or {}).get("rows"),
        "profile_span": _read(folder, "profile-span"),
        "profile_onnx_span": _read(folder, "profile-onnx-span"),
        "profile_onnx_span_padded": _read(folder, "profile-onnx-span-padded"),
        # a pass alone, on fresh shapes, and beside a thread running Python or preparing
        "pass_anatomy": {runtime: _read(folder, step) for runtime, step in PASS_ANATOMY_STEPS},
        "served": {
            name: _read(folder, f"served-{name}")
            for name in (
                "span-workers-1",
                "span-workers-32",
                "span-graphs-1",
                "span-graphs-32",
                "span-graphs-512-32",
                "span-graphs-switch",
                "span-traced-1",
                "span-traced-32",
                "span-1",
                "span-32",
                "span-one-lane",
                "span-split-1",
                "span-split-32",
                "span-split-traced",
                "span-batch1",
                "setgen-conll03",
                "bartner-conll03",
                "span-half",
                "span-half-32",
                "span-onnx-split-1",
                "span-onnx-split-32",
                "span-onnx-one-lane",
                "span-torchscript-1",
                "span-torchscript-32",
            )
        },
        "half_precision": _lines(folder, "half-precision"),
        "cuda_graphs": [
            *_lines(folder, "cuda-graphs-check"),
            *_lines(folder, "cuda-graphs-check-half"),
            *_lines(folder, "cuda-graphs-check-traced"),
        ],
        "bars": {
            "offline_over_bare_encoder": _bar(_ratio(span_best, bare_best), 1 / 3),
            "setgen_over_bartner_c64": _bar(_ratio(_rate(setgen), _rate(bartner)), 2),
        },
        # not the offline figure (one batch at a time): what two batches in flight reach
        "two_lanes_offline_over_bare_encoder": _ratio(
            two_lanes["sentences_per_second_sorted"] if two_lanes else None, bare_best
        ),
        # the served bars for each way of serving: the service's own on a device (HTTP workers in
        # front of the engine process, the backbone replayed from CUDA graphs); that with batches of
        # up to 512 sentences (32 a request only); that with all but the
        # backbone traced; that with a 0.05 ms switch interval; that without CUDA graphs; that in half
        # precision (against half's offline best); with the graphs in a process of their own (two
        # lanes there), and so with traced heads too; the service's own with TorchScript graphs, and
        # with ONNX Runtime's; the front in the engine's process
        "served_bars": {
            layout: _served_bars(folder, one, many, half_best if layout == "workers-half" else span_best)
            for layout, one, many in (
                ("workers", "span-graphs-1", "span-graphs-32"),
                ("workers-batch-512", None, "span-graphs-512-32"),  # served 32 sentences a request only
                ("workers-traced-heads", "span-traced-1", "span-traced-32"),
                ("workers-switch-0.05-ms", "span-graphs-switch", None),  # served one sentence a request only
                ("workers-no-cuda-graphs", "span-workers-1", "span-workers-32"),
                ("workers-half", "span-half", "span-half-32"),
                ("split", "span-split-1", "span-split-32"),
                ("split-traced-heads", "span-split-traced", None),  # served one sentence a request only
                ("workers-torchscript", "span-torchscript-1", "span-torchscript-32"),
                ("workers-onnx", "span-onnx-split-1", "span-onnx-split-32"),
                ("one-process", "span-1", "span-32"),
            )
        },
    }


def _served_bars(folder: Path, one: str | None, many: str | None, span_best: float | None) -> dict[str, Any]:
    c1, c64, c256 = (_level(folder, one, c) if one else None for c in (1, 64, 256))
    c16x32 = _level(folder, many, 16) if many else None
    return {
        "served_c256_over_offline": _bar(_ratio(_rate(c256), span_best), 0.5),
        "served_c16x32_over_offline": _bar(_ratio(_rate(c16x32), span_best), 0.7),
        "p99_ms_c64": _bar(c64["latency_ms"]["p99"] if c64 else None, 100, at_most=True),
        "p50_ms_c1": _bar(c1["latency_ms"]["p50"] if c1 else None, 10, at_most=True),
    }


@app.command()
def main(folder: Annotated[Path, typer.Option()] = Path("build/gpu-check")) -> None:
    report = summary(folder)
    (folder / "summary.json").write_text(json.dumps(report, indent=2) + "\n")
    shown = {**report["bars"], **report["served_bars"]}
    shown["two_lanes_offline_over_bare_encoder"] = report["two_lanes_offline_over_bare_encoder"]
    typer.echo(json.dumps(shown, indent=1))


if __name__ == "__main__":
    app()
