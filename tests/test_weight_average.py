"""Weight averaging of two runs: LoRA adapters are averaged by their deltas (not factor by factor),
cut back to their rank by SVD; plain tensors are averaged; models that differ cannot be averaged."""

import datetime
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from nerserve.ner.model_store import WEIGHTS, file_sha256, read_manifest
from nerserve.ner.training.weight_average import AverageError, average_low_rank, average_models, average_tensors
from tests.serving import LOCATIONS

RANK, ROWS, COLUMNS = 4, 12, 10


def adapter(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    return rng.normal(size=(RANK, COLUMNS)), rng.normal(size=(ROWS, RANK))


def test_low_rank_average_is_the_best_rank_r_approximation_of_the_averaged_deltas() -> None:
    rng = np.random.default_rng(0)
    (a1, b1), (a2, b2) = adapter(rng), adapter(rng)
    a, b, dropped = average_low_rank((a1, b1), (a2, b2), 0.25)
    target = 0.25 * b1 @ a1 + 0.75 * b2 @ a2
    singular = np.linalg.svd(target, compute_uv=False)
    assert a.shape == a1.shape and b.shape == b1.shape
    # Eckart–Young: the error of the best rank-r approximation is the energy beyond the r-th value
    assert np.linalg.norm(target - b @ a) == pytest.approx(np.sqrt((singular[RANK:] ** 2).sum()), rel=1e-9)
    assert dropped == pytest.approx(np.sqrt((singular[RANK:] ** 2).sum() / (singular**2).sum()))
    assert 0.0 < dropped < 1.0
    naive = (0.25 * b1 + 0.75 * b2) @ (0.25 * a1 + 0.75 * a2)
    assert np.linalg.norm(target - naive) > np.linalg.norm(target - b @ a)


def test_adapters_sharing_a_down_projection_average_exactly() -> None:
    rng = np.random.default_rng(1)
    a1, b1 = adapter(rng)
    b2 = rng.normal(size=b1.shape)
    a, b, dropped = average_low_rank((a1, b1), (a1, b2), 0.5)
    np.testing.assert_allclose(b @ a, 0.5 * (b1 + b2) @ a1, atol=1e-10)
    assert dropped < 1e-7


def test_plain_tensors_average_and_lora_pairs_travel_together() -> None:
    rng = np.random.default_rng(2)
    names = ("layer.q.lora_A.default.weight", "layer.q.lora_B.default.weight")
    scalar = "head.offset"  # a 0-d tensor (gliner's score offset): its average must stay an array to be saved
    first = dict(zip(names, adapter(rng), strict=True)) | {"head.bias": np.array([1.0, 3.0], dtype=np.float32)}
    second = dict(zip(names, adapter(rng), strict=True)) | {"head.bias": np.array([3.0, 5.0], dtype=np.float32)}
    first[scalar], second[scalar] = np.array(-4.0, dtype=np.float16), np.array(-2.0, dtype=np.float16)
    averaged, dropped = average_tensors(first, second, 0.5)
    assert averaged.keys() == first.keys() and dropped > 0
    np.testing.assert_array_equal(averaged["head.bias"], [2.0, 4.0])
    assert isinstance(averaged[scalar], np.ndarray) and averaged[scalar].shape == () and averaged[scalar] == -3.0
    assert averaged[scalar].dtype == np.float16
    expected, _, _ = average_low_rank((first[names[0]], first[names[1]]), (second[names[0]], second[names[1]]), 0.5)
    np.testing.assert_array_equal(averaged[names[0]], expected)
    with pytest.raises(AverageError, match="different tensors"):
        average_tensors(first, {k: v for k, v in second.items() if k != "head.bias"}, 0.5)
    with pytest.raises(AverageError, match="shape"):
        average_tensors(first, second | {"head.bias": np.zeros(3, dtype=np.float32)}, 0.5)


def test_a_committed_model_averaged_with_itself_is_itself(tmp_path: Path) -> None:
    out = tmp_path / "span-conll03-avg"
    committed_dir = LOCATIONS.model_dir("span-conll03")
    manifest = average_models(committed_dir, committed_dir, out, 0.5)
    original = load_file(str(committed_dir / WEIGHTS))
    averaged = load_file(str(out / WEIGHTS))
    for name, value in original.items():
        if "lora_B" in name:  # compare the adapter's delta, which is what the average keeps
            down = name.replace("lora_B", "lora_A")
            delta = value.astype(np.float64) @ original[down].astype(np.float64)
            again = averaged[name].astype(np.float64) @ averaged[down].astype(np.float64)
            np.testing.assert_allclose(again, delta, atol=2e-3 * np.abs(delta).max() + 1e-6, err_msg=name)
        elif "lora_A" not in name:
            np.testing.assert_array_equal(averaged[name], value, err_msg=name)
    committed = read_manifest(committed_dir)
    assert manifest.config == committed.config and manifest.scores == {}
    assert manifest.name == out.name
    assert manifest.version == f"{datetime.date.today().isoformat()}.{file_sha256(out / WEIGHTS)[:8]}"
    assert manifest.training["weight_average"]["weight"] == 0.5
    assert read_manifest(out) == manifest


def test_models_of_different_architectures_are_refused_in_one_line(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "nerserve", "average", "span-conll03", "nag-conll03", "--out", str(tmp_path / "x")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr.startswith("error: the two models differ in architecture: 'span' against 'nag'")
    assert "Traceback" not in result.stderr and not (tmp_path / "x").exists()
