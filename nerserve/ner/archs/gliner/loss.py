"""Training objective of the label-matching network: binary cross-entropy over every (span,
label) pair of each pass, summed per sentence (GLiNER's objective; positives are rare, and a sum
keeps their gradient from being averaged away over ~S·L pairs). Optionally focal (Lin et al., 2017;
GLiNER's `loss_gamma` / `loss_alpha`): pairs the network already gets right weigh (1 - p_t)^gamma,
so the ~S·L easy non-entities stop pulling every score down, and alpha weighs positives against
negatives."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from nerserve.ner.archs.gliner.network import GlinerNetwork
from nerserve.ner.archs.gliner.signatures import MATCH_INPUTS
from nerserve.ner.types import EntitySet


def targets_of(spans: np.ndarray, gold: list[EntitySet], labels: list[tuple[str, ...]]) -> np.ndarray:
    """[R, S, L] float32: 1 where span s of row r is an entity of label l of that row's prompt."""
    targets = np.zeros((len(gold), spans.shape[1], max(len(x) for x in labels)), dtype=np.float32)
    for r, (entities, names) in enumerate(zip(gold, labels, strict=True)):
        column = {name: c for c, name in enumerate(names)}
        where = {(int(s), int(e)): k for k, (s, e) in enumerate(spans[r].tolist())}
        for entity in entities:
            k = where.get((entity.start, entity.end))
            if entity.type in column and k is not None and not entity.is_discontinuous:
                targets[r, k, column[entity.type]] = 1.0
    return targets


def pair_mask(span_mask: np.ndarray, labels: list[tuple[str, ...]]) -> np.ndarray:
    counts = np.array([len(x) for x in labels])
    label_mask = np.arange(max(counts)) < counts[:, None]
    return (span_mask[:, :, None] & label_mask[:, None, :]).astype(np.float32)


def pair_losses(logits: torch.Tensor, targets: torch.Tensor, gamma: float = 0.0, alpha: float | None = None) -> torch.Tensor:
    """Each pair's loss: binary cross-entropy, focal when gamma > 0, alpha-weighted when alpha is set
    (alpha for a positive, 1 - alpha for a negative)."""
    losses = F.binary_cross_entropy_with_logits(logits, targets, reduction="none")
    if gamma > 0:
        probability = torch.sigmoid(logits)
        right = probability * targets + (1 - probability) * (1 - targets)
        losses = losses * (1 - right) ** gamma
    if alpha is not None:
        losses = losses * (alpha * targets + (1 - alpha) * (1 - targets))
    return losses


def gliner_loss(
    network: GlinerNetwork,
    feeds: dict[str, torch.Tensor],
    targets: torch.Tensor,
    mask: torch.Tensor,
    gamma: float = 0.0,
    alpha: float | None = None,
) -> torch.Tensor:
    logits = network.logits(*(feeds[name] for name in MATCH_INPUTS))
    losses = pair_losses(logits.float(), targets, gamma, alpha) * mask
    return losses.sum() / targets.shape[0]
