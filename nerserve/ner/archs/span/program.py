"""Runs the span architecture's graphs for a batch of sentences (numpy in, numpy out)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from nerserve.ner.archs.base import ProgramBase
from nerserve.ner.archs.feeds import encoder_feeds
from nerserve.ner.archs.grouping import group_feeds, size_groups
from nerserve.ner.archs.span.config import DecodeOptions, SpanConfig
from nerserve.ner.archs.span.decode import decode_batch
from nerserve.ner.archs.span.signatures import SPAN_PROPOSAL
from nerserve.ner.graph import Value
from nerserve.ner.text.subword import Words
from nerserve.ner.types import EntitySet


def seed_count(n_words: int, max_width: int) -> int:
    """How many seed spans a sentence of N_WORDS has: every span of 1 to max_width words."""
    return sum(max(n_words - width + 1, 0) for width in range(1, max_width + 1))


@lru_cache(maxsize=16)
def seed_table(longest: int, max_width: int) -> tuple[np.ndarray, np.ndarray]:
    """Every sentence length's seed spans [start, end) up to LONGEST words, in order of width, then of
    start, each length's padded to the longest's count:
    [LONGEST + 1, K, 2] seeds (the padding, the legal span [0, 1)) and their [LONGEST + 1, K] mask,
    read-only. A batch's seeds are then one gather by its sentences' lengths, where a copy of each
    sentence's own seeds into the batch cost the engine about a microsecond a sentence."""
    count = seed_count(longest, max_width)
    seeds = np.zeros((longest + 1, count, 2), dtype=np.int64)
    seeds[..., 1] = 1
    mask = np.zeros((longest + 1, count), dtype=np.float32)
    n_words = np.arange(longest + 1)
    first = np.zeros(longest + 1, dtype=np.int64)  # each length's first seed of the width at hand
    for width in range(1, max_width + 1):
        rows, starts = np.nonzero(np.arange(longest)[None, :] <= n_words[:, None] - width)
        columns = first[rows] + starts
        seeds[rows, columns, 0], seeds[rows, columns, 1], mask[rows, columns] = starts, starts + width, 1.0
        first += np.maximum(n_words - width + 1, 0)
    seeds.flags.writeable = mask.flags.writeable = False
    return seeds, mask


def batch_seeds(lengths: Sequence[int], max_width: int) -> tuple[np.ndarray, np.ndarray]:
    """The batch's seeds [B, K, 2] and seed mask [B, K], K its longest sentence's seed count: from
    the table of lengths up to the next power of two (a few tables a model; at a window's 256 words
    6.5 MB for seeds up to 5 words wide, 12 MB up to 9)."""
    longest = max(lengths, default=0)
    seeds, mask = seed_table(1 << max(longest - 1, 1).bit_length(), max_width)
    rows, count = np.asarray(lengths, dtype=np.intp), seed_count(longest, max_width)
    return seeds[rows, :count], mask[rows, :count]


@dataclass
class SpanBatch:
    encoder_inputs: dict[str, np.ndarray]
    seeds: np.ndarray  # [B, K, 2] int64
    seed_mask: np.ndarray  # [B, K] float32
    lengths: list[int]
    padded_tokens: int


class SpanProgram(ProgramBase[SpanConfig, SpanBatch, DecodeOptions]):
    def prepare(self, sentences: Sequence[Words]) -> SpanBatch:
        inputs, encoded = encoder_feeds(self.subwords, sentences)
        lengths = list(encoded.word_counts)
        seeds, seed_mask = batch_seeds(lengths, self.config.max_width)
        return SpanBatch(inputs, seeds, seed_mask, lengths, encoded.padded_tokens)

    def span_inputs(
        self, batch: SpanBatch, encoded: Mapping[str, Value], options: DecodeOptions | Sequence[DecodeOptions] | None
    ) -> dict[str, Value]:
        """The span-proposal graph's feeds: the encoder's outputs, the batch's seeds, and each
        sentence's filter threshold (the graph adjusts and classifies only the seeds it passes)."""
        chosen = self.per_sentence(options, len(batch.lengths))
        return {
            "word_states": encoded["word_states"],
            "context": encoded["context"],
            "word_mask": batch.encoder_inputs["word_mask"],
            "seeds": batch.seeds,
            "seed_mask": batch.seed_mask,
            "filter_threshold": np.array([o.filter_threshold for o in chosen], dtype=np.float32),
        }

    def propose(
        self,
        batch: SpanBatch,
        encoded: Mapping[str, np.ndarray],
        options: DecodeOptions | Sequence[DecodeOptions] | None = None,
    ) -> dict[str, np.ndarray]:
        """The span-proposal graph on groups of sentences with similar seed counts (a batch's
        sentences are padded to its largest's seeds otherwise), its candidates joined as one call's."""
        seed_counts = batch.seed_mask.sum(axis=1).astype(np.int64)
        groups = size_groups(seed_counts.tolist())
        graph, feeds = self.graphs["span_proposal"], self.span_inputs(batch, encoded, options)
        if len(groups) == 1:
            return graph.run(feeds)
        widths = {"words": np.asarray(batch.lengths, dtype=np.int64), "spans": seed_counts}
        parts = [graph.run(group_feeds(feeds, SPAN_PROPOSAL, widths, rows)) for rows in groups]
        return join_candidates(groups, parts)

    def run(self, batch: SpanBatch, options: DecodeOptions | Sequence[DecodeOptions] | None = None) -> dict[str, np.ndarray]:
        """The options' filter thresholds reach the span-proposal graph; the rest are decoding's. On a
        GPU the encoder's states stay there for the span proposal, which takes the whole batch in one
        call: a host round trip of the states, and a call per seed-count group, cost a GPU more than
        the padding they save."""
        encoder = self.graphs["encoder"]
        if encoder.device_resident:
            encoded = encoder.run(batch.encoder_inputs, keep_on_device=("word_states", "context"))
            return self.graphs["span_proposal"].run(self.span_inputs(batch, encoded, options))
        encoded = encoder.run(batch.encoder_inputs)
        return {**encoded, **self.propose(batch, encoded, options)}

    def export_values(self, batch: SpanBatch) -> dict[str, np.ndarray]:
        run = self.run(batch)
        return {**self.span_inputs(batch, run, None), **batch.encoder_inputs, **run}

    def decode(
        self,
        batch: SpanBatch,
        outputs: Mapping[str, np.ndarray],
        options: DecodeOptions | Sequence[DecodeOptions] | None = None,
    ) -> list[EntitySet]:
        chosen = self.per_sentence(options, len(batch.lengths))
        return decode_batch(outputs["candidates"], outputs["spans"], outputs["class_probs"], self.config.labels, chosen)


def join_candidates(groups: Sequence[np.ndarray], parts: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Groups' candidates as the whole batch's call gives them: batch sentence numbers, sentence by
    sentence, each sentence's in seed order (a group's seeds keep their numbers: only cut at the end)."""
    joined = {name: np.concatenate([part[name] for part in parts]) for name in parts[0]}
    joined["candidates"][:, 0] = np.concatenate(
        [rows[part["candidates"][:, 0]] for rows, part in zip(groups, parts, strict=True)]
    )
    order = np.lexsort((joined["candidates"][:, 1], joined["candidates"][:, 0]))
    return {name: value[order] for name, value in joined.items()}
