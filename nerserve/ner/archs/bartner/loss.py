"""BARTNER training loss: teacher-forced cross-entropy of each sentence's whole entity sequence."""

from __future__ import annotations

import torch

from nerserve.ner.archs.bartner.network import BartnerNetwork
from nerserve.ner.archs.feeds import ENCODER_INPUTS
from nerserve.ner.archs.pointer.loss import generation_loss
from nerserve.ner.archs.pointer.targets import Row, sequence_of
from nerserve.ner.types import Entity


def bartner_loss(
    network: BartnerNetwork, inputs: dict[str, torch.Tensor], gold: list[frozenset[Entity]]
) -> tuple[torch.Tensor, dict[str, float]]:
    states, _ = network.encoder(*(inputs[name] for name in ENCODER_INPUTS))
    memory, keys = network.decoder.project(states, inputs["word_mask"])
    rows = [Row(b, sequence_of(list(entities), network.config.vocabulary)) for b, entities in enumerate(gold)]
    loss = generation_loss(network.decoder, memory, inputs["word_mask"], keys, rows)
    return loss, {"gen": float(loss.detach())}
