"""Shared test fixtures: paths to the real data, and a tiny random backbone folder for shape tests."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent
DATA = ROOT.parent / "shared" / "data"


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
