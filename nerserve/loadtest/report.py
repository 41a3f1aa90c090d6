"""Outputs: JSON summary, CSV (perf_analyzer-like columns), markdown table, throughput-latency PNG."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

CSV_COLUMNS = (
    "mode",
    "model",
    "concurrency",
    "rate",
    "requests",
    "ok",
    "errors",
    "http_429",
    "sentences_per_second",
    "words_per_second",
    "server_tokens_per_second",
    "p50",
    "p90",
    "p95",
    "p99",
    "p99.9",
    "server_queue_ms_mean",
    "server_batch_inference_ms_mean",
    "server_batch_size_mean",
)


def flat_row(run: dict[str, Any]) -> dict[str, Any]:
    row = {k: run.get(k, "") for k in CSV_COLUMNS}
    for key in ("p50", "p90", "p95", "p99", "p99.9"):
        row[key] = round(run["latency_ms"].get(key, float("nan")), 2)
    return row


def knee(runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The highest-throughput point whose p99 is at most twice the lightest load's p99."""
    ok = [r for r in runs if r["ok"]]
    if not ok:
        return None
    base = ok[0]["latency_ms"]["p99"]
    within = [r for r in ok if r["latency_ms"]["p99"] <= 2 * base]
    return max(within or ok[:1], key=lambda r: r["sentences_per_second"])


def slo_throughput(runs: list[dict[str, Any]], slo_p99_ms: float) -> dict[str, Any] | None:
    """MLPerf-server style: the highest offered rate whose p99 stays under the bound, error-free."""
    passing = [r for r in runs if r["mode"] == "open" and r["errors"] == 0 and r["latency_ms"]["p99"] <= slo_p99_ms]
    return max(passing, key=lambda r: r["rate"]) if passing else None


def markdown(runs: list[dict[str, Any]]) -> str:
    lines = [
        "| mode | load | sentences/s | words/s | p50 ms | p90 ms | p99 ms | p99.9 ms | errors | 429 | batch | queue ms |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in runs:
        load = f"c={r['concurrency']}" if r["mode"] == "closed" else f"{r['rate']}/s"
        lat = r["latency_ms"]
        lines.append(
            f"| {r['mode']} | {load} | {r['sentences_per_second']:.1f} | {r['words_per_second']:.0f} | "
            f"{lat['p50']:.1f} | {lat['p90']:.1f} | {lat['p99']:.1f} | {lat['p99.9']:.1f} | {r['errors']} | "
            f"{r['http_429']} | {r.get('server_batch_size_mean', 0):.1f} | {r.get('server_queue_ms_mean', 0):.1f} |"
        )
    return "\n".join(lines) + "\n"


def plot(runs: list[dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4.5))
    for mode, marker in (("closed", "o-"), ("open", "s--")):
        chosen = [r for r in runs if r["mode"] == mode and r["ok"]]
        if chosen:
            axis.plot(
                [r["sentences_per_second"] for r in chosen],
                [r["latency_ms"]["p99"] for r in chosen],
                marker,
                label=f"{mode} loop, p99",
            )
            axis.plot(
                [r["sentences_per_second"] for r in chosen],
                [r["latency_ms"]["p50"] for r in chosen],
                marker,
                alpha=0.4,
                label=f"{mode} loop, p50",
            )
    point = knee([r for r in runs if r["mode"] == "closed"] or runs)
    if point:
        axis.scatter(
            [point["sentences_per_second"]],
            [point["latency_ms"]["p99"]],
            s=160,
            facecolors="none",
            edgecolors="red",
            linewidths=2,
            label="knee",
            zorder=5,
        )
    axis.set_xlabel("throughput (sentences/s)")
    axis.set_ylabel("latency (ms)")
    axis.set_yscale("log")
    axis.set_title(title)
    axis.grid(True, alpha=0.3)
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def plot_overload(runs: list[dict[str, Any]], path: Path, title: str) -> None:
    """An open-loop sweep as the overload curve: goodput and refusals (left), and the p99 of the
    accepted requests and of the 429s (right), against the offered load."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    chosen = sorted((r for r in runs if r["mode"] == "open"), key=lambda r: r["rate"])
    offered = [r["rate"] * r["sentences_per_request"] for r in chosen]
    figure, (rates, latency) = plt.subplots(1, 2, figsize=(11, 4.5))
    rates.plot(offered, offered, ":", color="grey", label="offered")
    rates.plot(offered, [r["sentences_per_second"] for r in chosen], "o-", label="goodput (200)")
    rates.plot(offered, [r["http_429"] / r["seconds"] for r in chosen], "s--", label="refused (429)/s")
    rates.set_xlabel("offered load (sentences/s)")
    rates.set_ylabel("sentences/s")
    rates.legend()
    latency.plot(offered, [r["latency_ms"]["p99"] for r in chosen], "o-", label="p99, accepted")
    refused = [(x, r["rejected_latency_ms"]["p99"]) for x, r in zip(offered, chosen, strict=True) if r["http_429"]]
    if refused:
        latency.plot(*zip(*refused, strict=True), "s--", label="p99, 429s")
    latency.set_xlabel("offered load (sentences/s)")
    latency.set_ylabel("latency (ms)")
    latency.set_yscale("log")
    latency.legend()
    for axis in (rates, latency):
        axis.grid(True, alpha=0.3)
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def write_outputs(runs: list[dict[str, Any]], out: Path, meta: dict[str, Any], title: str) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    for index, run in enumerate(runs):  # one CSV of per-request samples per run, beside the summary
        with (out / f"samples-{index}.csv").open("w", newline="") as handle:
            rows = csv.writer(handle)
            rows.writerow(["due_s", "latency_s", "status", "server_queue_ms", "server_inference_ms"])
            rows.writerows(run.pop("samples", []))
    summary = {"meta": meta, "runs": runs, "knee": knee(runs)}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    with (out / "results.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        writer.writerows(flat_row(r) for r in runs)
    (out / "table.md").write_text(markdown(runs))
    plot(runs, out / "throughput_latency.png", title)
    if sum(r["mode"] == "open" for r in runs) > 1:
        plot_overload(runs, out / "overload.png", title)
    return summary
