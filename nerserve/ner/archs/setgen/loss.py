"""SetGNER training loss: generation cross-entropy of every row + 0.8 × BCE of the head / inside /
tail / none detector + 0.6 × cross-entropy of the occurrence count (the paper's weights)."""

from __future__ import annotations

import torch
from torch.nn import functional as F

from nerserve.ner.archs.feeds import ENCODER_INPUTS
from nerserve.ner.archs.pointer.loss import generation_loss
from nerserve.ner.archs.pointer.targets import IGNORE
from nerserve.ner.archs.setgen.network import SetgenNetwork
from nerserve.ner.archs.setgen.targets import SetgenTargets

DETECTOR_WEIGHT, COUNT_WEIGHT = 0.8, 0.6


def setgen_loss(
    network: SetgenNetwork, inputs: dict[str, torch.Tensor], targets: SetgenTargets
) -> tuple[torch.Tensor, dict[str, float]]:
    device = inputs["input_ids"].device
    states, _ = network.encoder(*(inputs[name] for name in ENCODER_INPUTS))
    word_mask = inputs["word_mask"]
    part_logits, count_logits = network.detectors(states)
    parts = torch.from_numpy(targets.parts).to(device)
    per_word = F.binary_cross_entropy_with_logits(part_logits, parts, reduction="none").mean(-1)
    detector = (per_word * word_mask).sum() / word_mask.sum()
    counts = torch.from_numpy(targets.counts).to(device)
    count = F.cross_entropy(count_logits.reshape(-1, count_logits.shape[-1]), counts.reshape(-1), ignore_index=IGNORE)
    loss = DETECTOR_WEIGHT * detector + COUNT_WEIGHT * count
    logged = {"head": float(detector.detach()), "count": float(count.detach())}
    if targets.rows:
        memory, keys = network.decoder.project(states, word_mask)
        generation = generation_loss(network.decoder, memory, word_mask, keys, targets.rows)
        loss = loss + generation
        logged["gen"] = float(generation.detach())
    return loss, logged
