"""Every committed model, re-scored on the first sentences of its dev split, must stay within one
F1 point of the figure its manifest records for that slice (catches drift in tokenisation,
decoding, loading or dependencies)."""

from dataclasses import replace
from pathlib import Path

import pytest

from nerserve.ner.data import named_split, read_split
from nerserve.ner.loading import load_model
from nerserve.ner.model_store import list_models, model_store_root, read_manifest
from nerserve.ner.runner import score

MODELS = list_models()


def test_models_are_committed() -> None:
    assert {"span-conll03", "span-genia"} <= set(MODELS)


@pytest.mark.parametrize("name", MODELS)
def test_dev_slice_f1_matches_manifest(name: str, data_root: Path) -> None:
    manifest = read_manifest(model_store_root() / name)
    recorded = manifest.scores["dev_slice"]
    folder, limit = data_root / manifest.data["folder"], int(recorded["sentences"])
    model = load_model(name)
    options = model.program.config.decode
    if model.spec.capabilities.open_labels:  # asked for the data's own label names
        dev, labels = named_split(folder, "dev", limit)
        options = replace(options, labels=labels)
    else:
        dev = read_split(folder, "dev", limit)
    report = score(lambda batch: model.program.predict(batch, options), dev, batch_size=32)
    assert report["f1"] >= recorded["f1"] - 0.01, f"{name}: dev-slice F1 {report['f1']:.4f} < {recorded['f1']:.4f}"
