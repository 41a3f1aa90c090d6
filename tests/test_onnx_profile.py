"""benchmarks/onnx_profile.py reads ONNX Runtime's own profile of span-conll03's exported graphs
(the path the GPU image serves), here on the CPU: every node a provider ran, a batch's time beside
its nodes', and only the measured batches' runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.serving import ROOT, onnx_graphs

SCRIPT = ROOT / "benchmarks" / "onnx_profile.py"


def test_a_profile_counts_each_graphs_nodes_and_runs_per_batch(data_root: Path) -> None:
    onnx_graphs("span-conll03")
    arguments = ["--device", "cpu", "--data", str(data_root / "conll03"), "--sizes", "1,8", "--repeats", "2", "--threads", "1"]
    result = subprocess.run(
        [sys.executable, str(SCRIPT), *arguments],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    report = json.loads(result.stdout)
    assert report["providers"] == {"encoder": ["CPUExecutionProvider"], "span_proposal": ["CPUExecutionProvider"]}
    lone, batch = report["sizes"]
    for graph in lone["graphs"].values():
        # a lone sentence is one call of each graph; its warm-up runs and the other size's are not counted
        assert graph["runs_per_batch"] == 1
        assert set(graph["by_provider"]) == {"CPUExecutionProvider"}
        assert graph["by_provider"]["CPUExecutionProvider"]["nodes"] > 50
        assert 0 < graph["node_ms"] <= graph["run_ms"] and not graph["copies"]
        assert graph["operators"][0]["ms"] >= graph["operators"][-1]["ms"]
    assert batch["graphs"]["encoder"]["runs_per_batch"] >= 1 and batch["wall_ms_per_batch"] > 0
