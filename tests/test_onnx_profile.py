"""benchmarks/onnx_profile.py reads ONNX Runtime's own profile of span-conll03's exported graphs
(the path the GPU image serves), here on the CPU: every node a provider ran, a batch's time beside
its nodes', and only the measured batches' runs; and the export made to measure the CPU's padding
choice on a device."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.serving import ROOT, onnx_graphs

SCRIPT = ROOT / "benchmarks" / "onnx_profile.py"


def profile(data_root: Path, *arguments: str, graph_cache: Path | None = None) -> dict[str, Any]:
    """onnx_profile.py's report for span-conll03 on the CPU (its graphs in GRAPH_CACHE, else the checkout's)."""
    environment = {**os.environ, **({"NERSERVE_GRAPH_CACHE": str(graph_cache)} if graph_cache else {})}
    command = [sys.executable, str(SCRIPT), "--device", "cpu", "--data", str(data_root / "conll03"), *arguments]
    result = subprocess.run(command, capture_output=True, text=True, check=True, cwd=ROOT, env=environment)
    report: dict[str, Any] = json.loads(result.stdout)
    return report


def test_a_profile_counts_each_graphs_nodes_and_runs_per_batch(data_root: Path) -> None:
    onnx_graphs("span-conll03")
    report = profile(data_root, "--sizes", "1,8", "--repeats", "2", "--threads", "1")
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


def test_the_padded_export_lives_beside_the_services_and_is_profiled(tmp_path: Path, data_root: Path) -> None:
    """`export --padded-backbone` writes graphs whose backbone runs its rows' padding (as eager torch
    on a device does) into a folder of their own, which the service's lookup never finds, and the
    profiler reads them on asking; an INT8 or TorchScript export cannot be asked for it."""
    from nerserve.export.build import export_model
    from nerserve.ner.graph_format import GraphFormat
    from nerserve.ner.model_store import Locations

    locations = Locations(model_store=ROOT / "model_store", graph_cache=tmp_path, data_root=data_root)
    source = locations.model_dir("span-conll03")
    info = export_model(source, GraphFormat.onnx, tmp_path, data_root, padded_backbone=True, parity_sentences=17)
    folder = locations.graph_set_folder("span-conll03", "onnx", padded=True)
    assert info["ready"] and folder.name.startswith("onnx-padded-") and folder.is_dir()
    assert not locations.graph_set_folder("span-conll03", "onnx").exists()
    report = profile(data_root, "--sizes", "1", "--repeats", "1", "--padded-backbone", graph_cache=tmp_path)
    assert report["backbone_on_real_subwords_only"] is False
    for int8, fmt in ((True, GraphFormat.onnx), (False, GraphFormat.torchscript)):
        with pytest.raises(ValueError, match="padded-backbone"):
            export_model(source, fmt, tmp_path, data_root, int8, padded_backbone=True)
