"""DiffusionNER training loss: gold spans → K noisy spans at a random timestep → denoiser →
Hungarian matching (scipy) of proposals to gold entities → type cross-entropy (no-entity class
auto-balanced) + boundary binary cross-entropy over the words of matched proposals."""

from __future__ import annotations

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment
from torch.nn import functional as F

from nerserve.ner.archs.diffusion.config import DiffusionConfig
from nerserve.ner.archs.diffusion.network import DiffusionNetwork
from nerserve.ner.archs.diffusion.schedule import Sampler, spans_to_noise
from nerserve.ner.archs.feeds import ENCODER_INPUTS
from nerserve.ner.types import EntitySet

Gold = list[tuple[int, int, int]]  # left word, right word (inclusive), class index (1..C)


def gold_spans(entities: EntitySet, labels: tuple[str, ...]) -> Gold:
    """Continuous entities as (left, right inclusive, class); a discontinuous one by its hull."""
    return sorted((e.start, e.end - 1, labels.index(e.type) + 1) for e in entities)


def clean_spans(golds: list[Gold], lengths: np.ndarray, config: DiffusionConfig, rng: np.random.Generator) -> np.ndarray:
    """x_0 [B, K, 2]: each sentence's gold spans repeated to fill K ("repeat" expansion); a
    sentence without entities gets placeholder spans around the middle of the noise space."""
    proposals = config.train_proposals
    x0 = np.zeros((len(golds), proposals, 2))
    for b, gold in enumerate(golds):
        if gold:
            chosen = np.resize(np.arange(len(gold)), proposals)
            left = np.array([gold[i][0] for i in chosen], dtype=np.float64)
            right = np.array([gold[i][1] for i in chosen], dtype=np.float64)
            x0[b] = spans_to_noise(left, right, np.full(proposals, lengths[b]), config.scale)
        else:
            unit = np.clip(rng.normal(0.5, 1 / 6, size=(proposals, 2)), 0.0, 1.0)
            x0[b] = (unit * 2.0 - 1.0) * config.scale
    return x0


def match(
    class_probs: np.ndarray, left_probs: np.ndarray, right_probs: np.ndarray, gold: Gold, weight: float, copies: int = 1
) -> tuple[np.ndarray, np.ndarray]:
    """Proposal and gold indices of the minimum-cost assignment for one sentence: cost =
    −weight·(p_left[l] + p_right[r]) − p_type[c] (probabilities, as the official matcher).

    One-to-many when `copies` > len(gold) (the official `repeat_gt_entities`): the gold list is
    repeated to `copies` columns (capped at the proposal count) and each copy takes one proposal,
    so every gold entity supervises several proposals spread by the assignment."""
    columns = np.resize(np.arange(len(gold)), max(len(gold), min(copies, len(class_probs))))
    left = np.array([gold[i][0] for i in columns])
    right = np.array([gold[i][1] for i in columns])
    classes = np.array([gold[i][2] for i in columns])
    cost = -weight * (left_probs[:, left] + right_probs[:, right]) - class_probs[:, classes]
    rows, cols = linear_sum_assignment(cost)
    return rows, columns[cols]


def diffusion_loss(
    network: DiffusionNetwork,
    inputs: dict[str, torch.Tensor],
    entities: list[EntitySet],
    sampler: Sampler,
    rng: np.random.Generator,
) -> tuple[torch.Tensor, dict[str, float]]:
    config = network.config
    device = inputs["input_ids"].device
    states, _ = network.encoder(*(inputs[name] for name in ENCODER_INPUTS))
    word_mask = inputs["word_mask"]
    lengths = word_mask.sum(dim=1).to(torch.int64).cpu().numpy()
    golds = [gold_spans(e, config.labels) for e in entities]
    x0 = clean_spans(golds, lengths, config, rng)
    t = rng.integers(0, config.timesteps, size=len(golds))
    x_t = sampler.noisy(x0, t, rng.standard_normal(x0.shape))
    class_logits, left_logits, right_logits = network.denoiser.logits(
        states, word_mask, torch.from_numpy(x_t.astype(np.float32)).to(device), torch.from_numpy(t).to(device)
    )
    with torch.no_grad():  # the matching costs in fp32 (numpy has no bf16, for autocast training)
        class_probs = torch.softmax(class_logits.float(), -1).cpu().numpy()
        left_probs = torch.sigmoid(left_logits.float()).cpu().numpy()
        right_probs = torch.sigmoid(right_logits.float()).cpu().numpy()
    targets = np.zeros(class_logits.shape[:2], dtype=np.int64)
    sentence, proposal, left_target, right_target = [], [], [], []
    for b, gold in enumerate(golds):
        if not gold:
            continue
        rows, cols = match(class_probs[b], left_probs[b], right_probs[b], gold, config.boundary_weight, config.gold_copies)
        for k, g in zip(rows.tolist(), cols.tolist(), strict=True):
            targets[b, k] = gold[g][2]
            sentence.append(b)
            proposal.append(k)
            left_target.append(gold[g][0])
            right_target.append(gold[g][1])
    matched = len(sentence)
    total = targets.size
    # the official nil_weight = -1: the no-entity class weighs matched / unmatched proposals (≤ 1)
    weights = torch.ones(class_logits.shape[-1], device=device)
    weights[0] = min(1.0, max(matched, 1) / max(total - matched, 1))
    type_loss = F.cross_entropy(
        class_logits.reshape(-1, class_logits.shape[-1]), torch.from_numpy(targets).to(device).reshape(-1), weight=weights
    )
    if not matched:
        return type_loss, {"type": float(type_loss.detach())}
    index_b = torch.tensor(sentence, device=device)
    index_k = torch.tensor(proposal, device=device)
    real = word_mask[index_b]  # [M, N]
    boundary = torch.zeros((), device=device)
    for logits, target in ((left_logits, left_target), (right_logits, right_target)):
        chosen = logits[index_b, index_k]  # [M, N]
        onehot = F.one_hot(torch.tensor(target, device=device), chosen.shape[-1]).to(chosen.dtype)
        per_word = F.binary_cross_entropy_with_logits(chosen, onehot, reduction="none") * real
        boundary = boundary + per_word.sum() / matched
    loss = type_loss + config.boundary_weight * boundary
    return loss, {"type": float(type_loss.detach()), "boundary": float(boundary.detach())}
