"""The pointer decoder's teacher-forced generation loss (torch), shared by setgen and bartner."""

from __future__ import annotations

import torch
from torch.nn import functional as F

from nerserve.ner.archs.pointer.network import PointerDecoder
from nerserve.ner.archs.pointer.targets import IGNORE, Row, teacher


def generation_loss(
    decoder: PointerDecoder, memory: torch.Tensor, word_mask: torch.Tensor, keys: torch.Tensor, rows: list[Row]
) -> torch.Tensor:
    forced = teacher(rows)
    device = memory.device
    logits, _ = decoder.logits(
        memory,
        word_mask,
        keys,
        decoder.cross(memory),
        torch.from_numpy(forced.sentence).to(device),
        torch.from_numpy(forced.inputs).to(device),
        torch.from_numpy(forced.positions).to(device),
        decoder.empty_cache(len(rows), device),
    )
    targets = torch.from_numpy(forced.targets).to(device)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE)
