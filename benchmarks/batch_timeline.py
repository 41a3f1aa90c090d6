"""A served run's batches, level by level, from a server's `--batch-log` and the levels of
`served_check.py` that loaded it (their `monotonic_seconds`, on the same clock): how many passes a
level ran and of what size, how busy the device was and where it waited between passes, how long a
batch took from closing to its pass (its prepare, and the pass queued before it on the other lane)
and from its pass's end to its answers, why batches closed, and how many cohorts a closed loop's
clients travelled in (clients ÷ sentences a pass). On a device whose pass costs mostly a fixed part,
the cohorts set the served figure: docs/gpu.md.

    python benchmarks/batch_timeline.py --log OUT/batches-span-graphs.jsonl \
        --served OUT/served-span-graphs-1.json --served OUT/served-span-graphs-32.json
"""

from __future__ import annotations

import itertools
import json
import statistics
from collections import Counter
from pathlib import Path
from typing import Annotated, Any

import typer

app = typer.Typer(add_completion=False)


def read_log(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def read_served(path: Path) -> dict[str, Any]:
    """served_check.py's report: its --out file, or its standard output (the report its last line)."""
    text = path.read_text().strip()
    if not text:
        return {}
    try:
        report: dict[str, Any] = json.loads(text)
    except json.JSONDecodeError:
        report = json.loads(text.splitlines()[-1])
    return report


def device_ms_mean(passes: list[dict[str, Any]]) -> float | None:
    """The passes' mean time on the device's own clock, or None where a pass has none."""
    own = [b.get("device_ms") for b in passes]
    timed = [float(ms) for ms in own if ms is not None]
    return round(statistics.fmean(timed), 2) if len(timed) == len(own) else None


def level_timeline(batches: list[dict[str, Any]], began: float, ended: float, clients: int) -> dict[str, Any]:
    """The batches whose pass started within [BEGAN, ENDED], in the order their passes started."""
    passes = sorted((b for b in batches if began <= b["at"]["started"] <= ended), key=lambda b: b["at"]["started"])
    if not passes:
        return {"passes": 0}
    at = [b["at"] for b in passes]
    window = ended - began
    gaps = [max(0.0, later["started"] - earlier["finished"]) for earlier, later in itertools.pairwise(at)]
    sizes = [b["sentences"] for b in passes]
    mean_size = statistics.fmean(sizes)
    return {
        "passes": len(passes),
        "sentences_a_pass": round(mean_size, 1),
        "run_ms_mean": round(statistics.fmean(b["run_ms"] for b in passes), 2),
        # the same passes on the device's own clock, where it has one (older logs: none)
        "device_ms_mean": device_ms_mean(passes),
        # the device's own time: passes back to back count once (a pass's own time is from the end of
        # the one queued before it)
        "device_busy": round(sum(a["finished"] - a["started"] for a in at) / window, 3),
        "idle_ms_between_passes": {
            "mean": round(1000 * statistics.fmean(gaps), 3) if gaps else 0.0,
            "max": round(1000 * max(gaps), 3) if gaps else 0.0,
            "share_of_passes_after_a_wait": round(sum(gap > 0.0005 for gap in gaps) / len(gaps), 3) if gaps else 0.0,
        },
        "closed_to_started_ms_mean": round(1000 * statistics.fmean(a["started"] - a["closed"] for a in at), 3),
        "closed_to_taken_ms_mean": round(1000 * statistics.fmean(a["taken"] - a["closed"] for a in at), 3),
        "finished_to_answered_ms_mean": round(1000 * statistics.fmean(a["answered"] - a["finished"] for a in at), 3),
        "lanes": dict(sorted(Counter(str(b["lane"]) for b in passes).items())),
        "closed": dict(sorted(Counter(b["closed"] for b in passes).items())),
        "cohorts": round(clients / mean_size, 2),
    }


@app.command()
def main(
    log: Annotated[Path, typer.Option(help="the server's --batch-log file")],
    served: Annotated[list[Path], typer.Option(help="served_check.py's JSON (one or more)")],
    out: Annotated[Path | None, typer.Option(help="JSON file to write")] = None,
) -> None:
    batches = read_log(log)
    report = []
    for path in served:
        run = read_served(path)
        for row in run.get("levels", []):
            bounds = row.get("monotonic_seconds")
            if not bounds:
                continue
            clients = row["concurrency"] * row["sentences_per_request"]
            report.append(
                {
                    "served": path.name,
                    "concurrency": row["concurrency"],
                    "sentences_per_request": row["sentences_per_request"],
                    "sentences_per_second": row["sentences_per_second"],
                    **level_timeline(batches, bounds["began"], bounds["ended"], clients),
                }
            )
    text = json.dumps(report, indent=1)
    typer.echo(text)
    if out is not None:
        out.write_text(text + "\n")


if __name__ == "__main__":
    app()
