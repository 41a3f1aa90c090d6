"""Runs NAG-NER's graphs for a batch of sentences (numpy in, numpy out): encoder once, choose the
(start word, rank) queries from the start probabilities, one decoder pass over all of them, parse.

The same program serves training-time evaluation (eager graphs), export parity and the service.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from nerserve.ner.archs.base import ProgramBase
from nerserve.ner.archs.feeds import encoder_feeds
from nerserve.ner.archs.nag.config import NagConfig, NagDecodeOptions
from nerserve.ner.archs.nag.decode import decode_queries
from nerserve.ner.text.subword import SubwordBatch, Words
from nerserve.ner.types import EntitySet

EXPORT_QUERIES = 7  # example query count for export: distinct from every other example axis


@dataclass
class NagBatch:
    encoder_inputs: dict[str, np.ndarray]
    subwords: SubwordBatch  # the word map: each word's sub-word positions, made for the sentences asked
    lengths: list[int]
    padded_tokens: int

    @property
    def pieces(self) -> list[list[list[int]]]:
        """Per sentence, per word: its sub-word positions."""
        return self.subwords.pieces


class NagProgram(ProgramBase[NagConfig, NagBatch, NagDecodeOptions]):
    """`outcomes` counts how generated sequences ended: exact / merged / outside (<O>) / unmapped."""

    def prepare(self, sentences: Sequence[Words]) -> NagBatch:
        inputs, encoded = encoder_feeds(self.subwords, sentences)
        # the decoder's memory is the sentence's word sub-words: each knows its word, and
        # specials and padding are masked out (a pointer can only name a word's sub-word)
        subword_words = np.zeros(encoded.sentence_positions, dtype=np.int64)
        memory_mask = np.zeros(encoded.sentence_positions, dtype=np.float32)
        sentence, word, piece = np.nonzero(encoded.subword_mask)
        positions = encoded.subword_index[sentence, word, piece]
        subword_words[sentence, positions] = word
        memory_mask[sentence, positions] = 1.0
        inputs.update({"subword_words": subword_words, "memory_mask": memory_mask})
        return NagBatch(inputs, encoded, list(encoded.word_counts), encoded.padded_tokens)

    def select_queries(self, batch: NagBatch, start_probs: np.ndarray, thresholds: np.ndarray) -> dict[str, np.ndarray]:
        """Words whose p(no entity starts here) < τ_s start argmax-count entities: one query each."""
        starts = (start_probs[..., 0] < thresholds[:, None]) & (batch.encoder_inputs["word_mask"] > 0)
        counts = np.where(starts, start_probs[..., 1:].argmax(axis=-1) + 1, 0)
        sentence, word = np.nonzero(counts)
        repeat = counts[sentence, word]
        sentence, word = np.repeat(sentence, repeat), np.repeat(word, repeat)
        first = np.cumsum(repeat) - repeat
        rank = np.arange(len(sentence)) - np.repeat(first, repeat)
        position = batch.encoder_inputs["subword_index"][sentence, word, 0]
        return {
            "query_sentence": sentence.astype(np.int64),
            "query_word": word.astype(np.int64),
            "query_position": position.astype(np.int64),
            "query_rank": rank.astype(np.int64),
        }

    def _decoder(
        self, batch: NagBatch, encoded: Mapping[str, np.ndarray], queries: dict[str, np.ndarray]
    ) -> dict[str, np.ndarray]:
        if len(queries["query_sentence"]) == 0:
            empty = (0, self.config.length)
            return {"token_ids": np.zeros(empty, dtype=np.int64), "token_probs": np.zeros(empty, dtype=np.float32)}
        feeds = {
            "memory": encoded["memory"],
            "memory_mask": batch.encoder_inputs["memory_mask"],
            "word_queries": encoded["word_queries"],
            **queries,
        }
        return self.graphs["decoder"].run(feeds)

    def run(
        self, batch: NagBatch, options: NagDecodeOptions | Sequence[NagDecodeOptions] | None = None
    ) -> dict[str, np.ndarray]:
        # on a GPU the decoder's inputs stay there; the start probabilities come to the host,
        # which picks the queries (a no-op on the CPU)
        encoded = self.graphs["encoder"].run(batch.encoder_inputs, keep_on_device=("memory", "word_queries"))
        chosen = self.per_sentence(options, len(batch.lengths))
        thresholds = np.array([o.start_threshold for o in chosen], dtype=np.float32)
        queries = self.select_queries(batch, encoded["start_probs"], thresholds)
        return {**encoded, **queries, **self._decoder(batch, encoded, queries)}

    def export_values(self, batch: NagBatch) -> dict[str, np.ndarray]:
        """Every graph input and output for export examples, with a fixed number of queries (a
        trained or random model may select none, or as many as another axis is long)."""
        encoded = self.graphs["encoder"].run(batch.encoder_inputs)
        pairs = [(b, w) for b, n in enumerate(batch.lengths) for w in range(n)][:EXPORT_QUERIES]
        sentence = np.array([b for b, _ in pairs], dtype=np.int64)
        word = np.array([w for _, w in pairs], dtype=np.int64)
        queries = {
            "query_sentence": sentence,
            "query_word": word,
            "query_position": batch.encoder_inputs["subword_index"][sentence, word, 0].astype(np.int64),
            "query_rank": np.arange(len(pairs), dtype=np.int64) % self.config.o_max,
        }
        return {**batch.encoder_inputs, **encoded, **queries, **self._decoder(batch, encoded, queries)}

    def decode(
        self,
        batch: NagBatch,
        outputs: Mapping[str, np.ndarray],
        options: NagDecodeOptions | Sequence[NagDecodeOptions] | None = None,
    ) -> list[EntitySet]:
        """Entity sets of the batch's sentences; `options` may differ per sentence."""
        chosen = self.per_sentence(options, len(batch.lengths))
        sentence, word = outputs["query_sentence"], outputs["query_word"]
        # τ_s again: outputs run with a looser τ_s (dev tuning) hold a superset of the queries,
        # and a query's tokens do not depend on the other queries.
        thresholds = np.array([o.start_threshold for o in chosen], dtype=np.float32)
        keep = outputs["start_probs"][sentence, word, 0] < thresholds[sentence]
        queries = list(zip(sentence[keep].tolist(), word[keep].tolist(), strict=True))
        return decode_queries(
            outputs["token_ids"][keep],
            outputs["token_probs"][keep],
            queries,
            batch.subwords.sentence_pieces,
            len(batch.lengths),
            self.config,
            chosen,
            self.outcomes,
        )
