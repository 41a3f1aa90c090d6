"""GNER's teacher-forced generation loss (torch): cross-entropy of every target token, over a
sampled vocabulary.

The tied output projection over the whole vocabulary (30k rows) costs about as much as the six
decoder layers together; training scores only the batch's target tokens, the tag tokens of its
label lists and a uniform sample of other tokens (negatives that keep unrelated tokens down for
free generation). Inference scores the whole vocabulary.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import torch
from torch.nn import functional as F

from nerserve.ner.archs.gner.network import GnerNetwork

IGNORE = -100
NEGATIVES = 2048


def gner_loss(
    network: GnerNetwork,
    inputs: Mapping[str, torch.Tensor],
    targets: Sequence[Sequence[int]],
    start: int,
    also_scored: Iterable[int] = (),
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """`inputs`: the encoder graph's inputs [B, S]; `targets`: each sentence's token ids, end
    included; `also_scored`: tokens to keep in the sampled vocabulary (the label lists' tags)."""
    device = inputs["input_ids"].device
    memory = network.memory(inputs["input_ids"], inputs["attention_mask"], inputs["shape_ids"])
    cross = network.decoder.cross(memory)
    steps = max(len(t) for t in targets)
    given = torch.full((len(targets), steps), start, dtype=torch.long)
    wanted = torch.full((len(targets), steps), IGNORE, dtype=torch.long)
    for row, target in enumerate(targets):
        given[row, 1 : len(target)] = torch.tensor(target[:-1])
        wanted[row, : len(target)] = torch.tensor(target)
    positions = torch.arange(steps).unsqueeze(0).expand(len(targets), -1)
    padding = inputs["attention_mask"] < 0.5
    states, _ = network.decoder.states(
        cross, padding, given.to(device), positions.to(device), network.decoder.empty_cache(len(targets), device)
    )
    size = network.decoder.vocabulary_size
    needed = torch.cat([wanted[wanted != IGNORE], torch.tensor(list(also_scored), dtype=torch.long)])
    sampled = torch.randint(0, size, (NEGATIVES,), generator=generator)
    vocabulary = torch.unique(torch.cat([needed, sampled]))
    index = torch.full((size,), -1, dtype=torch.long)
    index[vocabulary] = torch.arange(len(vocabulary))
    local = torch.where(wanted == IGNORE, IGNORE, index[wanted.clamp(min=0)])
    logits = network.decoder.scores(states, vocabulary.to(device))
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), local.to(device).reshape(-1), ignore_index=IGNORE)
