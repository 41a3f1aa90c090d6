"""benchmarks/gpu_summary.py on the H200 check's own files (docs/reference-run/gpu-h200-check): each
served level's passes against offline batches of their size in arrival order, and what alternating
passes of half the loop would serve at those batches' costs."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
H200_CHECK = ROOT / "docs" / "reference-run" / "gpu-h200-check"


@pytest.fixture(scope="module")
def summary(tmp_path_factory: pytest.TempPathFactory) -> dict:
    folder = tmp_path_factory.mktemp("check") / "gpu-check"
    shutil.copytree(H200_CHECK, folder)
    subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_summary.py"), "--folder", str(folder)],
        check=True,
        capture_output=True,
    )
    return json.loads((folder / "summary.json").read_text())


def level(passes: dict, concurrency: int, per_request: int = 1) -> dict:
    (row,) = (r for r in passes["levels"] if (r["concurrency"], r["sentences_per_request"]) == (concurrency, per_request))
    return row


def test_a_served_pass_is_set_against_an_offline_batch_of_its_size_in_arrival_order(summary: dict) -> None:
    # the default layout replays the backbone: offline that program took 32 sentences in arrival
    # order at 3,094 a second (10.34 ms a batch) and 128 at 6,780 (18.88 ms); c = 256 ran passes of
    # 66.4 sentences in 13.29 ms, where a batch of that size takes 13.40 between the two
    at_256 = level(summary["served_passes"]["workers"], 256)
    assert at_256["sentences_a_pass"] == 66.4 and at_256["pass_ms"] == 13.29
    assert at_256["offline_arrival_batch_ms"] == pytest.approx(13.40, abs=0.01)
    assert at_256["pass_over_offline_batch"] == pytest.approx(0.9918, abs=1e-4)
    # the plain program's served passes against its own offline batches (batch 1: 104 a second)
    lone = level(summary["served_passes"]["workers-no-cuda-graphs"], 1)
    assert lone["offline_arrival_batch_ms"] == pytest.approx(1000 / 104.0, rel=0.01)


def test_alternating_passes_of_half_the_loop_are_bounded_by_the_offline_batches_costs(summary: dict) -> None:
    plain = summary["served_passes"]["workers-no-cuda-graphs"]
    best = summary["offline"]["span-conll03"]["sentences_per_second_sorted"]  # 17,061, batch 512 sorted
    # c = 256: passes of at most 128, the plain program's best there 8,291 a second in arrival order
    assert plain["back_to_back_c256_over_offline"] == pytest.approx(8291 / best, abs=2e-4)
    # 16 × 32: at most 256 a pass, 11,801 a second
    assert plain["back_to_back_c16x32_over_offline"] == pytest.approx(11801 / best, abs=2e-4)


def test_a_layout_the_check_did_not_serve_has_no_figures(summary: dict) -> None:
    # that run carried no onnxruntime-gpu: nothing served through ONNX Runtime, nothing invented
    onnx = summary["served_passes"]["workers-onnx"]
    assert onnx == {"levels": [], "back_to_back_c256_over_offline": None, "back_to_back_c16x32_over_offline": None}
