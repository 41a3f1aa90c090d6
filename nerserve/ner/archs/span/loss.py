"""Training objective of Locate and Label (paper §2.5), vectorised over batch × spans × gold.

- filter: focal loss, positives are seeds with IoU ≥ α1 to their best gold entity;
- regressor: smooth-L1 on both offsets + 1-D overlap (GIoU-style) loss, on positive seeds;
- classifier: focal cross-entropy on the adjusted spans (label = gold type when IoU ≥ α2) and,
  so that it sees clean positives from the first step, on the seeds themselves;
- soft examples: every loss term is weighted IoU^η (IoU ≥ α) or (1 − IoU)^η (IoU < α).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from nerserve.ner.archs.span.config import SpanConfig
from nerserve.ner.archs.span.network import SpanNetwork
from nerserve.ner.types import EntitySet


def gold_tensors(gold: list[EntitySet], labels: tuple[str, ...]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Contiguous gold entities as [B, G, 2] spans, [B, G] class ids (1-based), [B, G] mask.
    Discontinuous entities are out of this architecture's reach and are skipped."""
    index = {label: i + 1 for i, label in enumerate(labels)}
    listed = [[e for e in entities if not e.is_discontinuous and e.type in index] for entities in gold]
    width = max(1, max(len(x) for x in listed))
    spans = np.zeros((len(gold), width, 2), dtype=np.int64)
    spans[..., 1] = 1
    classes = np.zeros((len(gold), width), dtype=np.int64)
    mask = np.zeros((len(gold), width), dtype=np.float32)
    for b, entities in enumerate(listed):
        for g, entity in enumerate(entities):
            spans[b, g] = (entity.start, entity.end)
            classes[b, g] = index[entity.type]
            mask[b, g] = 1.0
    return torch.from_numpy(spans), torch.from_numpy(classes), torch.from_numpy(mask)


def best_match(spans: torch.Tensor, gold: torch.Tensor, gold_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """IoU of each span with its best gold entity [B, K] and that entity's index [B, K]."""
    s, e = spans[..., 0].unsqueeze(-1).float(), spans[..., 1].unsqueeze(-1).float()
    gs, ge = gold[..., 0].unsqueeze(1).float(), gold[..., 1].unsqueeze(1).float()
    inter = (torch.minimum(e, ge) - torch.maximum(s, gs)).clamp(min=0)
    union = (e - s) + (ge - gs) - inter
    iou = (inter / union) * gold_mask.unsqueeze(1)
    return iou.max(dim=-1)


def soft_weights(iou: torch.Tensor, positive: torch.Tensor, eta: float) -> torch.Tensor:
    return torch.where(positive, iou.pow(eta), (1 - iou).pow(eta))


def focal_binary(logits: torch.Tensor, target: torch.Tensor, gamma: float) -> torch.Tensor:
    log_p = F.log_softmax(logits, dim=-1)
    log_pt = torch.where(target, log_p[..., 1], log_p[..., 0])
    return -((1 - log_pt.exp()).pow(gamma) * log_pt)


def focal_multiclass(logits: torch.Tensor, target: torch.Tensor, gamma: float) -> torch.Tensor:
    log_pt = F.log_softmax(logits, dim=-1).gather(-1, target.unsqueeze(-1)).squeeze(-1)
    return -((1 - log_pt.exp()).pow(gamma) * log_pt)


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (values * mask).sum() / mask.sum().clamp(min=1.0)


def span_loss(
    network: SpanNetwork,
    encoder_inputs: dict[str, torch.Tensor],
    seeds: torch.Tensor,
    seed_mask: torch.Tensor,
    gold: list[EntitySet],
) -> tuple[torch.Tensor, dict[str, float]]:
    config: SpanConfig = network.config
    head = network.head
    states, context = head.regularise(*network.encoder(**encoder_inputs))
    word_mask = encoder_inputs["word_mask"]
    filter_logits = head.filter(states, context, word_mask, seeds)
    offsets = head.regressor(states, context, word_mask, seeds)
    gold_spans, gold_classes, gold_mask = (t.to(seeds.device) for t in gold_tensors(gold, config.labels))

    # filter and regressor on the seeds
    iou, match = best_match(seeds, gold_spans, gold_mask)
    positive = iou >= config.iou_filter
    weights = soft_weights(iou, positive, config.soft_eta) * seed_mask
    filter_loss = _masked_mean(focal_binary(filter_logits, positive, config.focal_gamma) * weights, seed_mask)

    matched = gold_spans.gather(1, match.unsqueeze(-1).expand(-1, -1, 2))
    targets = (matched - seeds).float()
    regress_mask = positive.float() * seed_mask
    smooth = F.smooth_l1_loss(offsets, targets, reduction="none").sum(-1)
    predicted = seeds.float() + offsets
    inter = torch.minimum(predicted[..., 1], matched[..., 1]) - torch.maximum(predicted[..., 0], matched[..., 0])
    hull = torch.maximum(predicted[..., 1], matched[..., 1]) - torch.minimum(predicted[..., 0], matched[..., 0])
    overlap = 1 - inter / hull.clamp(min=1e-6)
    regress_loss = _masked_mean(smooth + overlap, regress_mask)

    # classifier on the seeds and on the adjusted spans
    lengths = word_mask.sum(dim=1).to(seeds.dtype)
    adjusted = head.adjust(seeds, offsets.detach(), lengths.unsqueeze(1))
    spans = torch.cat([seeds, adjusted], dim=1)
    span_mask = torch.cat([seed_mask, seed_mask], dim=1)
    class_logits = head.classifier(states, context, word_mask, spans)
    iou_c, match_c = best_match(spans, gold_spans, gold_mask)
    positive_c = iou_c >= config.iou_classifier - 1e-6
    classes = torch.where(positive_c, gold_classes.gather(1, match_c), torch.zeros_like(match_c))
    weights_c = soft_weights(iou_c, positive_c, config.soft_eta) * span_mask
    class_loss = _masked_mean(focal_multiclass(class_logits, classes, config.focal_gamma) * weights_c, span_mask)

    total = filter_loss + regress_loss + class_loss
    parts = {"filter": filter_loss.item(), "regress": regress_loss.item(), "class": class_loss.item()}
    return total, parts
