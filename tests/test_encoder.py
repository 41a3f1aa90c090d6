"""The shared encoder's BiLSTM as inference runs it: both directions in one packed call, the same
word states as the two-LSTM path that training and export use, on every real word."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from nerserve.ner.archs.span.graphs import SpanProposalGraph
from nerserve.ner.encoder import LengthSafeBiLSTM
from nerserve.ner.loading import InferenceDropout


@pytest.mark.parametrize("lengths", [[7], [5, 9, 1, 9], [3, 3, 2]])
def test_packed_directions_give_the_two_lstms_states_on_real_words_and_zeros_on_padding(lengths: list[int]) -> None:
    torch.manual_seed(0)
    lstm = LengthSafeBiLSTM(12, 8).eval()
    words = max(lengths)
    x = torch.randn(len(lengths), words, 12)
    sizes = torch.tensor(lengths)
    with torch.inference_mode():
        expected = lstm(x, sizes)
        lstm.fuse_for_eager()
        got = lstm(x, sizes)
    real = torch.arange(words).unsqueeze(0) < sizes.unsqueeze(1)
    assert got.shape == expected.shape == (len(lengths), words, 16)
    assert torch.allclose(got[real], expected[real], atol=1e-6)
    assert not got[~real].any()


@pytest.mark.parametrize("model", ["span-conll03", "diffusion-conll03"])
def test_a_model_loaded_for_inference_finds_what_it_finds_as_trained(model: str, data_root: Path) -> None:
    """Merged LoRA and the fused forms (load_model(merged=True)) against the model as
    training and export load it: the same entity sets, padding states zeroed or not (diffusion
    reads boundary scores over every position of a row, padding masked)."""
    from nerserve.ner.data import read_split
    from nerserve.ner.loading import load_model
    from nerserve.ner.model_store import Locations

    folder = Locations().model_dir(model)
    trained, served = load_model(folder, "cpu"), load_model(folder, "cpu", merged=True)
    assert any(m.both_directions is not None for m in served.network.modules() if isinstance(m, LengthSafeBiLSTM))
    fused_heads = [m.fused_words is not None for m in served.network.modules() if isinstance(m, SpanProposalGraph)]
    assert fused_heads == ([True] if model.startswith("span") else [])
    # every dropout (the backbone's and the heads') passes its input on without a call into torch
    assert not any(type(m) is torch.nn.Dropout for m in served.network.modules())
    assert sum(isinstance(m, InferenceDropout) for m in served.network.modules()) > 10
    sentences = [list(s.tokens) for s in read_split(data_root / "conll03", "test", 96)]
    expected = [e for start in range(0, 96, 32) for e in trained.program.predict(sentences[start : start + 32])]
    found = [e for start in range(0, 96, 32) for e in served.program.predict(sentences[start : start + 32])]
    assert sum(map(len, expected)) > 100
    assert found == expected
