"""Every committed model, re-scored on the first sentences of its dev split, must stay within one
F1 point of the figure its manifest records for that slice (catches drift in tokenisation,
decoding, loading or dependencies)."""

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from nerserve.ner.data import named_split, read_split
from nerserve.ner.loading import load_model
from nerserve.ner.model_store import read_manifest
from nerserve.ner.runner import score
from nerserve.ner.text.subword import ROW_SUBWORDS
from tests.serving import LOCATIONS

MODELS = LOCATIONS.list_models()


def test_models_are_committed() -> None:
    assert {"span-conll03", "span-genia"} <= set(MODELS)


@pytest.mark.parametrize("name", MODELS)
def test_dev_slice_f1_matches_manifest(name: str, data_root: Path) -> None:
    manifest = read_manifest(LOCATIONS.model_dir(name))
    recorded = manifest.scores["dev_slice"]
    folder, limit = data_root / manifest.data["folder"], int(recorded["sentences"])
    model = load_model(LOCATIONS.model_dir(name))
    options = model.program.config.decode
    if model.spec.capabilities.open_labels:  # asked for the data's own label names
        dev, labels = named_split(folder, "dev", limit)
        options = replace(options, labels=labels)
    else:
        dev = read_split(folder, "dev", limit)
    report = score(lambda batch: model.program.predict(batch, options), dev, batch_size=32)
    assert report["f1"] >= recorded["f1"] - 0.01, f"{name}: dev-slice F1 {report['f1']:.4f} < {recorded['f1']:.4f}"


@pytest.mark.parametrize("name", ["span-conll03", "nag-genia"])
def test_packed_rows_give_what_one_sentence_a_row_gives(name: str, data_root: Path) -> None:
    """A committed model's outputs on real dev sentences packed several to an encoder row equal
    those with every sentence in a row of its own, to float rounding, and its entities are the
    same: packing is a speed-up, never a change of results."""
    model = load_model(LOCATIONS.model_dir(name))
    folder = data_root / read_manifest(LOCATIONS.model_dir(name)).data["folder"]
    sentences = [list(s.tokens) for s in read_split(folder, "dev", 48)]
    program, results = model.program, []
    for row_subwords in (0, ROW_SUBWORDS):  # ends on the default
        program.subwords.row_subwords = row_subwords
        batch = program.prepare(sentences)
        outputs = program.run(batch)
        results.append((batch, outputs, program.decode(batch, outputs)))
    (alone, alone_outputs, alone_entities), (packed, packed_outputs, packed_entities) = results
    assert packed.padded_tokens < alone.padded_tokens / 2
    for key, value in alone_outputs.items():
        if value.dtype.kind == "f" and value.shape == packed_outputs[key].shape:
            np.testing.assert_allclose(packed_outputs[key], value, atol=1e-4, err_msg=key)
    assert packed_entities == alone_entities
