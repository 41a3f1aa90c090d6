"""The shared training loop on a tiny random backbone (mechanics, never accuracy): the schedule fitted
to a time budget, bf16 autocast steps, and a warm start that continues a model of the same
architecture whole and keeps its earlier runs."""

from __future__ import annotations

import dataclasses
import datetime
import json
from pathlib import Path

import pytest
from safetensors.torch import load_file

from nerserve.ner.data import read_split
from nerserve.ner.model_store import WEIGHTS, file_sha256, read_manifest
from nerserve.ner.text.segment import PLAIN_WORDS
from nerserve.ner.training.loop import ModelRecord, TrainSettings, WarmupLinearDecay, epochs_within_budget, start_run
from nerserve.ner.training.span_trainer import train_span


def test_warmup_then_linear_decay() -> None:
    schedule = WarmupLinearDecay(warmup_steps=10, total_steps=110)
    assert [schedule(s) for s in (0, 5, 10, 60, 110, 200)] == [0.0, 0.5, 1.0, 0.5, 0.0, 0.0]


def test_epochs_fitted_to_the_budget() -> None:
    settings = TrainSettings(epochs=12, time_budget_minutes=8.0)
    assert epochs_within_budget(settings, 1, 1.5) == 5  # 1.5 min per epoch: 5 fit in 8
    assert epochs_within_budget(settings, 1, 0.1) == 12  # never more than asked
    assert epochs_within_budget(settings, 2, 20.0) == 2  # never fewer than done
    assert epochs_within_budget(TrainSettings(epochs=3), 1, 100.0) == 3  # no budget: as asked


@pytest.fixture(scope="module")
def small_cadec(data_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Twenty real CADEC sentences per split (the trainer reads a data folder)."""
    folder = tmp_path_factory.mktemp("cadec-small")
    for split in ("train", "dev", "test"):
        lines = (data_root / "cadec" / f"{split}.jsonl").read_text().splitlines()[:20]
        (folder / f"{split}.jsonl").write_text("\n".join(lines) + "\n")
    assert read_split(folder, "train")
    return folder


def test_bf16_budgeted_run_then_whole_model_warm_start(tiny_backbone: Path, small_cadec: Path, tmp_path: Path) -> None:
    first = tmp_path / "span-first"
    settings = TrainSettings(epochs=3, batch_size=8, precision="bf16", time_budget_minutes=60.0, eval_batch_size=8)
    manifest = train_span(small_cadec, first, settings, str(tiny_backbone), "cpu")
    assert [row["epoch"] for row in manifest.training["history"]] == [1, 2, 3]
    assert manifest.training["device"] == "cpu" and manifest.training["precision"] == "bf16"

    second = tmp_path / "span-second"
    continued = TrainSettings(epochs=1, batch_size=8, eval_batch_size=8, init_from=first, lr_lora=0.0, lr_heads=0.0)
    manifest = train_span(small_cadec, second, continued, str(tiny_backbone), "cpu")
    started = manifest.training["warm_start"]
    assert started["other_tensors"] > 0  # the heads came too, not only the encoder
    assert [len(run["history"]) for run in started["earlier_runs"]] == [3]
    # learning rate 0: the continued model is the first one, tensor for tensor
    before, after = load_file(str(first / WEIGHTS)), load_file(str(second / WEIGHTS))
    assert before.keys() == after.keys() and all((before[k] == after[k]).all() for k in before)
    assert json.loads((second / "manifest.json").read_text())["training"]["warm_start"]["model"] == first.name
    assert read_manifest(second).scores["dev"]["f1"] == read_manifest(first).scores["dev"]["f1"]
    # a version names the weights: the day they were trained and their digest
    version = read_manifest(first).version
    assert version == f"{datetime.date.today().isoformat()}.{file_sha256(first / WEIGHTS)[:8]}"
    assert read_manifest(second).version == version  # the same tensors, the same version


def test_gner_draws_a_fresh_balanced_sample_each_epoch_and_the_same_one_on_resume() -> None:
    from nerserve.ner.data import Sentence
    from nerserve.ner.training.gner_trainer import Source, epoch_rng, sample_mixture
    from nerserve.ner.types import EntitySet

    def source(name: str, count: int) -> Source:
        return Source(name, [Sentence((f"{name}{i}",), EntitySet([])) for i in range(count)], ("thing",))

    sources = [source("scored", 500), source("a", 500), source("b", 500)]
    first, second = (sample_mixture(sources, 100, 0.4, epoch_rng(7, epoch)) for epoch in (0, 1))
    assert sum(1 for _, index in first if index == 0) == 40
    assert sum(1 for _, index in first if index == 1) == 30  # the rest split evenly
    assert {s.tokens for s, _ in first} != {s.tokens for s, _ in second}
    assert sample_mixture(sources, 100, 0.4, epoch_rng(7, 1)) == second
    assert sum(1 for _, index in sample_mixture(sources, 100, 0.7, epoch_rng(7, 0)) if index == 0) == 70


def test_a_manifest_records_how_its_training_data_writes_words(data_root: Path, tiny_backbone: Path, tmp_path: Path) -> None:
    """GENIA writes "p50/p65" and "1,25(OH)2D3" whole: its models' texts are cut so in the service."""
    weights = tmp_path / WEIGHTS
    weights.write_bytes(b"weights")
    styles = {}
    for folder in ("genia", "conll03"):
        run = start_run(data_root / folder, TrainSettings(), str(tiny_backbone), "cpu")
        record = ModelRecord("m", "span", {"labels": ["X"]}, run.backbone, run.lora, data_root / folder, TrainSettings())
        assert record.manifest({}, {}, weights).words == PLAIN_WORDS  # none given: an imported model's
        record = dataclasses.replace(record, words=run.words)
        styles[folder] = record.manifest({}, {}, weights).words
    assert styles["genia"].slashes and styles["genia"].brackets and "induced" in styles["genia"].suffixes
    assert styles["conll03"] == PLAIN_WORDS
