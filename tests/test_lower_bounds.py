"""The core's declared lower bounds are tested, not guessed: a fresh virtual environment gets
`nerserve[cpu]` at exactly those versions (constraints/lower-bounds.txt, which pyproject.toml's
ranges must admit) and serves the exported graphs with the same entities as the locked install."""

from __future__ import annotations

import subprocess
import sys
import venv
from pathlib import Path

import httpx

from nerserve.ner.graph_format import EXPORT_JSON
from tests.serving import LOCATIONS, Server

ROOT = Path(__file__).resolve().parent.parent
TEXT = "All joints and muscles hurt after Lipitor."


def test_the_core_serves_at_its_lower_bounds(tmp_path: Path) -> None:
    if not (LOCATIONS.graph_set_folder("nag-cadec", "onnx") / EXPORT_JSON).is_file():
        subprocess.run([sys.executable, "-m", "nerserve", "export", "nag-cadec"], check=True, capture_output=True)
    venv.create(tmp_path / "venv", with_pip=True)
    python = str(tmp_path / "venv" / "bin" / "python")
    install = [python, "-m", "pip", "install", "-q", "-c", str(ROOT / "constraints/lower-bounds.txt"), f"{ROOT}[cpu]"]
    subprocess.run(install, check=True, capture_output=True, timeout=600)
    frozen = subprocess.run([python, "-m", "pip", "freeze"], check=True, capture_output=True, text=True).stdout
    assert "onnxruntime==1.19.0" in frozen and "fastapi==0.115.0" in frozen and "torch" not in frozen
    locations = {"model_store": LOCATIONS.model_store, "graph_cache": LOCATIONS.graph_cache}
    oldest = Server(python=python, cwd=str(tmp_path), models="nag-cadec", threads=1, **locations)
    locked = Server(models="nag-cadec", threads=1)
    try:
        answers = []
        for server in (locked, oldest):
            server.wait_ready()
            answers.append(httpx.post(f"{server.url}/extract", json={"texts": [TEXT]}, timeout=60).json())
        assert answers[0] == answers[1]
    finally:
        locked.stop()
        oldest.stop()
