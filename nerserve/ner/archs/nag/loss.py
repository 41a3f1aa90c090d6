"""NAG-NER training loss: token cross-entropy of every query's sequence (pads and the given <s>
ignored) + cross-entropy of the per-word entity-start count."""

from __future__ import annotations

import torch
from torch.nn import functional as F

from nerserve.ner.archs.feeds import ENCODER_INPUTS
from nerserve.ner.archs.nag.config import PAD
from nerserve.ner.archs.nag.network import NagNetwork
from nerserve.ner.archs.nag.targets import IGNORE, BatchTargets


def nag_loss(
    network: NagNetwork, inputs: dict[str, torch.Tensor], targets: BatchTargets
) -> tuple[torch.Tensor, dict[str, float]]:
    device = inputs["input_ids"].device
    states, hidden = network.encoder.encode(*(inputs[name] for name in ENCODER_INPUTS))
    start_logits, memory, word_queries = network.head(states, hidden, inputs["subword_words"])
    memory = memory * inputs["memory_mask"].unsqueeze(-1)
    counts = torch.full(start_logits.shape[:2], IGNORE, dtype=torch.int64)
    for b, per_word in enumerate(targets.counts):
        counts[b, : len(per_word)] = torch.tensor(per_word, dtype=torch.int64)
    start_loss = F.cross_entropy(
        start_logits.reshape(-1, start_logits.shape[-1]), counts.to(device).reshape(-1), ignore_index=IGNORE
    )
    if not targets.queries:
        return start_loss, {"start": float(start_loss.detach())}
    queries = targets.queries
    tokens = torch.tensor([q.tokens for q in queries], dtype=torch.int64)
    tokens = tokens.masked_fill(tokens == PAD, IGNORE)
    tokens[:, 0] = IGNORE  # <s> is given, not generated
    logits = network.decoder.logits(
        memory,
        inputs["memory_mask"],
        word_queries,
        torch.tensor([q.sentence for q in queries], device=device),
        torch.tensor([q.word for q in queries], device=device),
        inputs["subword_index"][
            torch.tensor([q.sentence for q in queries], device=device),
            torch.tensor([q.word for q in queries], device=device),
            0,
        ],
        torch.tensor([q.rank for q in queries], device=device),
    )
    generation = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens.to(device).reshape(-1), ignore_index=IGNORE)
    return generation + start_loss, {"gen": float(generation.detach()), "start": float(start_loss.detach())}
