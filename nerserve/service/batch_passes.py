"""A model's three batch stages as the scheduler calls them: prepare (its own thread), the graphs
(a lane), decode (its own thread). On the CPU a batch runs as groups of similar word counts
(`ProgramBase.length_groups`), one pass each on the batch's lane: the graphs pad every
sentence's word positions to the longest of its pass, and a batch in arrival order mixes lengths.
On a GPU (or the simulated device) a batch is one pass: a device pays less for padding than for
another pass."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from nerserve.ner.archs.base import ProgramBase
from nerserve.ner.archs.grouping import in_batch_order
from nerserve.ner.text.subword import Tokenized
from nerserve.ner.types import EntitySet
from nerserve.service.graph_process import GraphProcess

# What the batcher carries per sentence: the tokenised sentence (or window) and its options.
Payload = tuple[Tokenized, Any]


@dataclass(frozen=True)
class PreparedGroups:
    """A batch prepared for its graphs: `groups`, each part's sentences as indices into the batch;
    `parts`, each one's prepared batch and options."""

    groups: list[np.ndarray]
    parts: list[tuple[Any, list[Any]]]

    def padded_tokens(self) -> int:
        return sum(int(batch.padded_tokens) for batch, _ in self.parts)


@dataclass(frozen=True)
class BatchPasses:
    """`program` prepares, groups and decodes; its own graphs run the passes, or `graphs`, a graph
    process. `in_length_groups`: where the graphs run on the CPU (the program's own graphs may be a
    CPU copy beside a graph process on a device, so the service says)."""

    program: ProgramBase[Any, Any, Any]
    graphs: GraphProcess | None
    in_length_groups: bool

    def prepare(self, payloads: list[Payload]) -> PreparedGroups:
        sentences = [sentence for sentence, _ in payloads]
        options = [option for _, option in payloads]
        groups = self.program.length_groups(sentences) if self.in_length_groups else [np.arange(len(payloads))]
        if len(groups) == 1:  # every batch on a device, and most on the CPU: nothing to reorder
            return PreparedGroups(groups, [(self.program.prepare(sentences), options)])
        parts = [rows.tolist() for rows in groups]
        return PreparedGroups(
            groups, [(self.program.prepare([sentences[i] for i in rows]), [options[i] for i in rows]) for rows in parts]
        )

    def run(self, prepared: PreparedGroups) -> list[Any]:
        if self.graphs is not None:
            return [self.graphs.run(part) for part in prepared.parts]
        return [self.program.run(batch, options) for batch, options in prepared.parts]

    def decode(self, prepared: PreparedGroups, outputs: list[Any]) -> list[EntitySet]:
        found = [
            self.program.decode(batch, part_outputs, options)
            for (batch, options), part_outputs in zip(prepared.parts, outputs, strict=True)
        ]
        return found[0] if len(found) == 1 else in_batch_order(prepared.groups, found)

    def in_turn(self, payloads: list[Payload]) -> list[EntitySet]:
        """The three stages one after the other, on the calling thread (the warm-up's passes)."""
        prepared = self.prepare(payloads)
        return self.decode(prepared, self.run(prepared))
