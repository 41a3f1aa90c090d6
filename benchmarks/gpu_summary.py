"""The engine issue's ratios from one gpu_check.sh folder: what the model path reaches of the bare
encoder, what the service reaches of the model path, the latency bounds, setgen over bartner, and
half precision's gate; each next to its bar. Missing steps are reported as missing, never as zero.

Beside the served bars, what holds them (`served_passes`): for each way of serving, each level's
passes against offline batches of their size in arrival order, the order a server's batches come
in (a pass that costs more than such a batch, its host work included, pays for being served), and
what passes of up to half the sentences in flight, each costing such a batch, back to back, would
serve over the offline best: below a served bar, no way of forming batches meets it with those
passes' costs, and only cheaper passes of mixed lengths can.

    python benchmarks/gpu_summary.py --folder build/gpu-check
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import numpy as np
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


def _arrival_batch_ms(by_batch: dict[int, list[float]], size: float) -> float | None:
    """Milliseconds an offline batch of SIZE sentences in arrival order takes: linear between the
    batch sizes measured, None outside them."""
    points = sorted((batch, 1000 * batch / rates[1]) for batch, rates in by_batch.items() if rates[1])
    if not points or not points[0][0] <= size <= points[-1][0]:
        return None
    sizes, milliseconds = zip(*points, strict=True)
    return round(float(np.interp(size, sizes, milliseconds)), 2)


def _back_to_back(by_batch: dict[int, list[float]], in_flight: int, best: float | None) -> float | None:
    """Over BEST: the most sentences a second that offline batches in arrival order of at most half
    of IN_FLIGHT sentences reach, the size one of two alternating passes of a closed loop holds."""
    rates = [rates[1] for batch, rates in by_batch.items() if batch <= in_flight / 2]
    return _ratio(max(rates), best) if rates else None


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
    ("eager-compiled-heads", "pass-anatomy-compiled"),
    ("torchscript", "pass-anatomy-torchscript"),
)


# Each way of serving span: (its name in the summary, its served step at one sentence a request, at
# 32 a request, the offline program its passes run). The service's own on a device (HTTP workers in
# front of the engine process, the backbone replayed from CUDA graphs); that with batches of up to
# 512 sentences; that with all but the backbone traced; that with all but the backbone and the
# BiLSTM compiled (against the offline program so compiled); that with a 0.05 ms switch interval; that
# without CUDA graphs; that in half precision (against half's offline best); with the graphs in a
# process of their own (two lanes there), and so with traced heads too, and in two processes (a
# lane each); the service's own with TorchScript graphs, and with ONNX Runtime's; one graph lane,
# with each runtime; the front in the engine's process.
SERVED_LAYOUTS = (
    ("workers", "span-graphs-1", "span-graphs-32", "replayed"),
    ("workers-batch-512", None, "span-graphs-512-32", "replayed"),  # served 32 sentences a request only
    ("workers-traced-heads", "span-traced-1", "span-traced-32", "replayed"),
    ("workers-compiled-heads", "span-compiled-1", "span-compiled-32", "compiled"),
    ("workers-switch-0.05-ms", "span-graphs-switch", None, "replayed"),  # one sentence a request only
    ("workers-no-cuda-graphs", "span-workers-1", "span-workers-32", "plain"),
    ("workers-half", "span-half", "span-half-32", "half"),
    ("split", "span-split-1", "span-split-32", "replayed"),
    ("split-traced-heads", "span-split-traced", None, "replayed"),  # one sentence a request only
    ("split-processes", "span-split-processes-1", "span-split-processes-32", "replayed"),
    ("workers-torchscript", "span-torchscript-1", "span-torchscript-32", "torchscript"),
    ("workers-onnx", "span-onnx-split-1", "span-onnx-split-32", "onnx"),
    ("one-lane", "span-one-lane", "span-one-lane-32", "replayed"),
    ("onnx-one-lane", "span-onnx-one-lane", None, "onnx"),  # one sentence a request only
    ("one-process", "span-1", "span-32", "plain"),
)


def summary(folder: Path) -> dict[str, Any]:
    bare = _read(folder, "bare-encoder")
    bare_best = bare["best"].get("fp32") if bare else None
    span = _offline_best(folder, *_offline_steps("span-conll03"))
    replayed = _offline_best(folder, *_offline_steps("span-conll03-cuda-graphs"))
    compiled = _offline_best(folder, *_offline_steps("span-conll03-compiled"))
    # the served bars divide by the best the program reaches offline: with CUDA graphs or without,
    # with its heads compiled or not
    span_best = max((run["sentences_per_second_sorted"] for run in (span, replayed, compiled) if run), default=None)
    # half precision's served figures divide by its own offline best
    half = _offline_best(folder, *_offline_steps("span-conll03-half"))
    half_best = half["sentences_per_second_sorted"] if half else None
    two_lanes = _offline_best(folder, "offline-span-conll03-lanes2")
    # what each layout's passes run offline (on the CPU the served "replayed" layouts run plain: no capture there)
    offline_programs = {
        "plain": span,
        "replayed": replayed or span,
        "compiled": compiled,
        "half": half,
        "torchscript": _offline_best(folder, "offline-torchscript-span-conll03"),
        "onnx": _offline_best(folder, "offline-onnx-span-conll03"),
    }
    # what a layout's served figures are divided by: fp32's offline best, half precision's its own
    offline_best = {program: half_best if program == "half" else span_best for program in offline_programs}
    setgen, bartner = _level(folder, "setgen-conll03", 64), _level(folder, "bartner-conll03", 64)
    return {
        "environment": (folder / "environment.txt").read_text() if (folder / "environment.txt").is_file() else None,
        "bare_encoder": bare,
        "offline": {
            model: _offline_best(folder, *_offline_steps(model))
            for model in (
                "span-conll03",
                "span-conll03-cuda-graphs",
                "span-conll03-compiled",
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
        "profile_span_compiled": _read(folder, "profile-span-compiled"),
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
                "span-compiled-1",
                "span-compiled-32",
                "span-1",
                "span-32",
                "span-one-lane",
                "span-one-lane-32",
                "span-split-1",
                "span-split-32",
                "span-split-traced",
                "span-split-processes-1",
                "span-split-processes-32",
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
            *_lines(folder, "cuda-graphs-check-compiled"),
        ],
        "bars": {
            "offline_over_bare_encoder": _bar(_ratio(span_best, bare_best), 1 / 3),
            "setgen_over_bartner_c64": _bar(_ratio(_rate(setgen), _rate(bartner)), 2),
        },
        # not the offline figure (one batch at a time): what two batches in flight reach
        "two_lanes_offline_over_bare_encoder": _ratio(
            two_lanes["sentences_per_second_sorted"] if two_lanes else None, bare_best
        ),
        "served_bars": {
            layout: _served_bars(folder, one, many, offline_best[program]) for layout, one, many, program in SERVED_LAYOUTS
        },
        "served_passes": {
            layout: _served_passes(folder, one, many, offline_programs[program], offline_best[program])
            for layout, one, many, program in SERVED_LAYOUTS
        },
    }


def _served_passes(
    folder: Path, one: str | None, many: str | None, offline: dict[str, Any] | None, best: float | None
) -> dict[str, Any]:
    by_batch = offline["by_batch"] if offline else {}
    levels = []
    for name in (one, many):
        report = _read(folder, f"served-{name}") if name else None
        for row in report["levels"] if report else []:
            size, pass_ms = row.get("server_batch_size_mean"), row.get("server_batch_inference_ms_mean")
            offline_ms = _arrival_batch_ms(by_batch, size) if size and by_batch else None
            levels.append(
                {
                    "concurrency": row["concurrency"],
                    "sentences_per_request": row["sentences_per_request"],
                    "sentences_a_pass": size,
                    "pass_ms": pass_ms,
                    "offline_arrival_batch_ms": offline_ms,
                    "pass_over_offline_batch": _ratio(pass_ms, offline_ms),
                }
            )
    return {
        "levels": levels,
        "back_to_back_c256_over_offline": _back_to_back(by_batch, 256, best),
        "back_to_back_c16x32_over_offline": _back_to_back(by_batch, 16 * 32, best),
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
