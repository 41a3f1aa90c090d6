"""First start with an empty graph cache: `nerserve serve` on a fresh cache folder, and the seconds
until the default model first answers POST /extract and until each model is ready (from
/health/ready's per-model states, polled every half second). Writes first-start.json to `--out`.

    python benchmarks/first_start.py --out docs/reference-run

The bars (performance issue): first answer ≤ 60 s, every model ≤ 180 s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer

app = typer.Typer(add_completion=False)
SENTENCE = "Peter Blackburn reported from Brussels on Friday ."


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _watch(url: str, started: float, limit: float) -> dict[str, Any]:
    first_answer: float | None = None
    ready_at: dict[str, float] = {}
    states: dict[str, str] = {}
    while time.perf_counter() - started < limit:
        try:
            if first_answer is None and httpx.post(f"{url}/extract", json={"texts": [SENTENCE]}, timeout=10).status_code == 200:
                first_answer = time.perf_counter() - started
            states = httpx.get(f"{url}/health/ready", timeout=10).json().get("models", {})
        except httpx.HTTPError:
            pass  # not listening yet
        for name, state in states.items():
            if state != "loading" and name not in ready_at:
                ready_at[name] = time.perf_counter() - started
        if states and first_answer is not None and all(s != "loading" for s in states.values()):
            break
        time.sleep(0.5)
    return {
        "first_answer_s": None if first_answer is None else round(first_answer, 1),
        "all_settled_s": round(max(ready_at.values()), 1) if ready_at else None,
        "models": {name: {"state": states.get(name), "seconds": round(ready_at[name], 1)} for name in sorted(ready_at)},
        "still_loading": sorted(name for name, state in states.items() if state == "loading"),
    }


@app.command()
def main(
    out: Annotated[Path, typer.Option(help="folder for first-start.json")] = Path("docs/reference-run"),
    models: Annotated[str | None, typer.Option(help="comma-separated models (default: the whole store)")] = None,
    limit: Annotated[float, typer.Option(help="seconds to wait at most")] = 900.0,
) -> None:
    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="first-start-") as cache:
        command = [sys.executable, "-m", "nerserve", "--graph-cache", cache, "serve", "--port", str(port)]
        if models:
            command += ["--models", models]
        started = time.perf_counter()
        server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=os.environ.copy())
        try:
            report = _watch(f"http://127.0.0.1:{port}", started, limit)
        finally:
            server.terminate()
            server.wait(120)
    report.update(
        {
            "command": " ".join(command[1:]).replace(cache, "<empty folder>"),
            "cpu_count": os.cpu_count(),
            "bars": {"first_answer_s": 60, "every_model_s": 180},
        }
    )
    out.mkdir(parents=True, exist_ok=True)
    (out / "first-start.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    app()
