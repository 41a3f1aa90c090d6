"""The backbone over real sub-words only (ner.unpadded, what ONNX encoders run) against the backbone
over its padded rows: the same states at every real position, zeros at padding, for the BERT-shaped
backbones it takes; any other backbone keeps its padded rows."""

from __future__ import annotations

import pytest
import torch
from transformers import (
    BertConfig,
    BertModel,
    DistilBertConfig,
    DistilBertModel,
    ElectraConfig,
    ElectraModel,
    RobertaConfig,
    RobertaModel,
)

from nerserve.ner.encoder import EncoderConfig, WordEncoder

SIZES = {"hidden_size": 32, "num_hidden_layers": 3, "num_attention_heads": 4, "intermediate_size": 64, "vocab_size": 200}

# two rows: three sentences packed (the second row shorter), padding at both rows' ends
SEGMENTS = [[1, 1, 1, 2, 2, 2, 2, 3, 3, 0, 0], [4, 4, 4, 4, 4, 0, 0, 0, 0, 0, 0]]


def packed_rows() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    segment_ids = torch.tensor(SEGMENTS)
    starts = [[row.index(s) if s else 0 for s in row] for row in SEGMENTS]
    position_ids = (torch.arange(segment_ids.shape[1]) - torch.tensor(starts)) * (segment_ids > 0)
    input_ids = torch.randint(5, SIZES["vocab_size"], segment_ids.shape) * (segment_ids > 0)
    return input_ids, segment_ids, position_ids


def backbone_states(backbone: torch.nn.Module, real_subwords_only: bool) -> tuple[torch.Tensor, bool]:
    encoder = WordEncoder(backbone.eval(), SIZES["hidden_size"], EncoderConfig(last_layers=2)).eval()
    skipping = encoder.skip_padding() if real_subwords_only else False
    with torch.inference_mode():
        return encoder.backbone_states(*packed_rows()), skipping


@pytest.mark.parametrize(
    "backbone",
    [
        BertModel(BertConfig(**SIZES)),
        RobertaModel(RobertaConfig(**SIZES, max_position_embeddings=64)),
        ElectraModel(ElectraConfig(**SIZES, embedding_size=SIZES["hidden_size"])),
    ],
    ids=["bert", "roberta", "electra"],
)
def test_real_subwords_only_give_the_padded_backbones_states(backbone: torch.nn.Module) -> None:
    torch.manual_seed(0)
    padded, _ = backbone_states(backbone, real_subwords_only=False)
    torch.manual_seed(0)
    unpadded, skipping = backbone_states(backbone, real_subwords_only=True)
    real = torch.tensor(SEGMENTS) > 0
    assert skipping and unpadded.shape == padded.shape
    torch.testing.assert_close(unpadded[real], padded[real], atol=1e-5, rtol=1e-5)
    assert not unpadded[~real].any()
    assert padded[~real].abs().sum() > 0  # the padded backbone did compute its padding


@pytest.mark.parametrize(
    "backbone",
    [
        DistilBertModel(DistilBertConfig(vocab_size=200, dim=32, n_layers=2, n_heads=4, hidden_dim=64)),
        ElectraModel(ElectraConfig(**SIZES, embedding_size=16)),  # its embeddings projected up to its layers
    ],
    ids=["distilbert", "electra-projected"],
)
def test_another_backbone_keeps_its_padded_rows(backbone: torch.nn.Module) -> None:
    torch.manual_seed(0)
    padded, _ = backbone_states(backbone, real_subwords_only=False)
    torch.manual_seed(0)
    kept, skipping = backbone_states(backbone, real_subwords_only=True)
    assert not skipping
    torch.testing.assert_close(kept, padded)
