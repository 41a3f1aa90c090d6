"""Shared test fixtures: paths to the real data, and a tiny random backbone folder for shape tests.
Tests that start servers, subprocesses, exports, training or containers are end-to-end (marker
`e2e`): `pytest -m "not e2e"` runs the unit tests alone."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent
DATA = ROOT.parent / "shared" / "data"
# modules whose tests run real servers, subprocesses, exports, training runs or containers
END_TO_END = frozenset(
    {
        "test_cli", "test_deploy", "test_device", "test_docs_page", "test_ecosystem", "test_export",
        "test_gner_t5", "test_int8", "test_loadtest", "test_lower_bounds", "test_onnx_profile", "test_open_labels",
        "test_ray", "test_regression", "test_schema", "test_service", "test_tenants", "test_training",
        "test_weight_average", "test_images",
    }
)  # fmt: skip


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.stem in END_TO_END:
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session")
def data_root() -> Path:
    if not (DATA / "conll03" / "dev.jsonl").is_file():
        pytest.fail(f"the shared data must sit beside the checkout: {DATA} not found")
    return DATA


@pytest.fixture(scope="session")
def tiny_backbone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer, 32-wide random BERT with the real tokenizer: a local HF folder like users bring,
    small enough for unit tests of shapes, batching and export (never for accuracy)."""
    import torch
    from transformers import BertConfig, BertModel

    from nerserve.ner.backbone import resolve_backbone

    source = resolve_backbone().path
    folder = tmp_path_factory.mktemp("tiny-bert")
    torch.manual_seed(0)
    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
    BertModel(config).save_pretrained(folder)
    for name in ("tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json"):
        if (source / name).is_file():
            shutil.copy(source / name, folder / name)
    return folder
