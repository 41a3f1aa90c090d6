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
from nerserve.service.batch_passes import BatchPasses
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


@pytest.mark.parametrize("name", ["span-conll03", "nag-genia"])
def test_a_batch_in_length_groups_finds_what_it_finds_whole(name: str, data_root: Path) -> None:
    """On the CPU a batch mixing short and long sentences runs as two groups of similar word counts,
    offline (`program.predict`) and served (`BatchPasses`), and every sentence's entities are those
    the whole batch in one pass gives it, in the batch's order."""
    model = load_model(LOCATIONS.model_dir(name))
    folder = data_root / read_manifest(LOCATIONS.model_dir(name)).data["folder"]
    dev = [list(s.tokens) for s in read_split(folder, "dev", 600)]
    short, long = [s for s in dev if len(s) <= 12][:10], [s for s in dev if len(s) >= 30][:10]
    mixed = [sentence for pair in zip(short, long, strict=True) for sentence in pair]
    program = model.program
    assert len(program.length_groups(mixed)) == 2
    batch = program.prepare(mixed)
    whole = program.decode(batch, program.run(batch))
    assert any(whole) and program.predict(mixed) == whole
    served = BatchPasses(program, None, in_length_groups=True)
    prepared = served.prepare([(sentence, program.config.decode) for sentence in program.subwords.tokenize(mixed)])
    assert [len(rows) for rows in prepared.groups] == [10, 10]
    assert served.decode(prepared, served.run(prepared)) == whole
    on_a_device = BatchPasses(program, None, in_length_groups=False)  # a GPU's batch is one pass
    prepared = on_a_device.prepare([(sentence, program.config.decode) for sentence in program.subwords.tokenize(mixed)])
    assert len(prepared.parts) == 1 and on_a_device.decode(prepared, on_a_device.run(prepared)) == whole
