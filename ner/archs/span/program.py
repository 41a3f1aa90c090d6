"""Runs the span architecture's graphs for a batch of sentences (numpy in, numpy out).

The same program serves training-time evaluation (eager graphs), export parity checks and the
service (ONNX Runtime / TorchScript graphs).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ner.archs.feeds import encoder_feeds
from ner.archs.span.config import DecodeOptions, SpanConfig
from ner.archs.span.decode import decode_sentence
from ner.graph import Graph
from ner.text.subword import SubwordEncoder
from ner.types import EntitySet

GRAPHS = ("encoder", "span_proposal")


def enumerate_seeds(n_words: int, max_width: int) -> list[tuple[int, int]]:
    return [(i, i + w) for w in range(1, max_width + 1) for i in range(n_words - w + 1)]


@dataclass
class SpanBatch:
    encoder_inputs: dict[str, np.ndarray]
    seeds: np.ndarray  # [B, K, 2] int64
    seed_mask: np.ndarray  # [B, K] float32
    lengths: list[int]
    padded_tokens: int


class SpanProgram:
    def __init__(self, graphs: Mapping[str, Graph], config: SpanConfig, subwords: SubwordEncoder) -> None:
        missing = [name for name in GRAPHS if name not in graphs]
        if missing:
            raise ValueError(f"span program needs graphs {missing}")
        self.graphs = graphs
        self.config = config
        self.subwords = subwords

    def prepare(self, sentences: list[list[str]]) -> SpanBatch:
        inputs, encoded = encoder_feeds(self.subwords, sentences)
        seed_lists = [enumerate_seeds(len(words), self.config.max_width) for words in sentences]
        k = max(len(s) for s in seed_lists)
        seeds = np.zeros((len(sentences), k, 2), dtype=np.int64)
        seeds[..., 1] = 1  # padding seeds are the legal span [0, 1), masked out
        seed_mask = np.zeros((len(sentences), k), dtype=np.float32)
        for b, listed in enumerate(seed_lists):
            seeds[b, : len(listed)] = listed
            seed_mask[b, : len(listed)] = 1.0
        return SpanBatch(inputs, seeds, seed_mask, [len(w) for w in sentences], encoded.padded_tokens)

    @staticmethod
    def span_inputs(batch: SpanBatch, encoded: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The span-proposal graph's feeds: the encoder's outputs plus the batch's seeds."""
        return {
            "word_states": encoded["word_states"],
            "context": encoded["context"],
            "word_mask": batch.encoder_inputs["word_mask"],
            "seeds": batch.seeds,
            "seed_mask": batch.seed_mask,
        }

    def run(self, batch: SpanBatch, options: object = None) -> dict[str, np.ndarray]:
        """`options` are accepted for the shared program contract; span decoding uses them only
        after the graphs."""
        encoded = self.graphs["encoder"].run(batch.encoder_inputs)
        outputs = self.graphs["span_proposal"].run(self.span_inputs(batch, encoded))
        return {**encoded, **outputs}

    def export_values(self, batch: SpanBatch) -> dict[str, np.ndarray]:
        """Every graph input and output, as export examples."""
        return {**batch.encoder_inputs, "seeds": batch.seeds, "seed_mask": batch.seed_mask, **self.run(batch)}

    def decode(
        self,
        batch: SpanBatch,
        outputs: Mapping[str, np.ndarray],
        options: DecodeOptions | Sequence[DecodeOptions] | None = None,
    ) -> list[EntitySet]:
        """Entity sets of the batch's sentences; `options` may differ per sentence (one batch can
        carry several requests)."""
        count = len(batch.lengths)
        per_sentence = list(options) if isinstance(options, Sequence) else [options or self.config.decode] * count
        return [
            decode_sentence(
                outputs["filter_prob"][b],
                outputs["spans"][b],
                outputs["class_probs"][b],
                batch.seed_mask[b],
                self.config.labels,
                per_sentence[b],
            )
            for b in range(count)
        ]

    def predict(self, sentences: list[list[str]], options: DecodeOptions | None = None) -> list[EntitySet]:
        batch = self.prepare(sentences)
        return self.decode(batch, self.run(batch), options)
