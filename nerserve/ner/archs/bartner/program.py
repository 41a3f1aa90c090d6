"""Runs BARTNER's graphs for a batch of sentences (numpy in, numpy out): the encoder once, then one
decoder row per sentence writing its whole entity sequence left to right (`ptr … ptr type …
</s>`), greedy or by beam search; parse.

The same program serves training-time evaluation (eager graphs), export parity and the service.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from nerserve.ner.archs.bartner.config import BartnerConfig, BartnerOptions
from nerserve.ner.archs.base import ProgramBase
from nerserve.ner.archs.feeds import encoder_feeds
from nerserve.ner.archs.pointer.decoding import Grammar, decode_rows, pack, parse_groups, sentence_inputs, written_sequences
from nerserve.ner.archs.pointer.export import step_example
from nerserve.ner.archs.pointer.signatures import decoder_cache, sentence_states
from nerserve.ner.archs.pointer.vocabulary import START
from nerserve.ner.decoding.overlap import resolve
from nerserve.ner.text.subword import Words
from nerserve.ner.types import EntitySet


@dataclass
class BartnerBatch:
    encoder_inputs: dict[str, np.ndarray]
    lengths: list[int]
    padded_tokens: int


class BartnerProgram(ProgramBase[BartnerConfig, BartnerBatch, BartnerOptions]):
    def prepare(self, sentences: Sequence[Words]) -> BartnerBatch:
        inputs, encoded = encoder_feeds(self.subwords, sentences)
        return BartnerBatch(inputs, list(encoded.word_counts), encoded.padded_tokens)

    def run(
        self, batch: BartnerBatch, options: BartnerOptions | Sequence[BartnerOptions] | None = None
    ) -> dict[str, np.ndarray]:
        # on a GPU what every decoder step reads stays there (a no-op on the CPU)
        config = self.config
        encoded = self.graphs["encoder"].run(batch.encoder_inputs, keep_on_device=sentence_states(config.decoder_layers))
        chosen = self.per_sentence(options, len(batch.lengths))
        count = len(batch.lengths)
        lengths = np.array(batch.lengths, dtype=np.int64)
        limits = self.limits(lengths)
        written = decode_rows(
            self.graphs["decoder"],
            sentence_inputs(batch.encoder_inputs, encoded, config.decoder_layers),
            np.arange(count, dtype=np.int64),
            np.full(count, START, dtype=np.int64),
            np.zeros(count, dtype=np.int64),
            decoder_cache(config.decoder_layers, config.decoder_heads, config.decoder_dim),
            Grammar(config.vocabulary, lengths, many=True, limits=limits),
            int(limits.max()),
            np.array([o.beams for o in chosen], dtype=np.int64),
            np.ones(count, dtype=np.int64),
        )
        return {**encoded, **pack(written)}

    def limits(self, lengths: np.ndarray) -> np.ndarray:
        """Most tokens each sentence's row may write, `</s>` included (BARTNER: max_len + max_len_a × length)."""
        return (10 + self.config.max_length_words * lengths).astype(np.int64)

    def export_values(self, batch: BartnerBatch) -> dict[str, np.ndarray]:
        encoded = self.graphs["encoder"].run(batch.encoder_inputs)
        shared = sentence_inputs(batch.encoder_inputs, encoded, self.config.decoder_layers)
        step = step_example(self.graphs["decoder"], shared, batch.lengths, self.config)
        return {**batch.encoder_inputs, **encoded, **step}

    def decode(
        self,
        batch: BartnerBatch,
        outputs: Mapping[str, np.ndarray],
        options: BartnerOptions | Sequence[BartnerOptions] | None = None,
    ) -> list[EntitySet]:
        chosen = self.per_sentence(options, len(batch.lengths))
        limits = self.limits(np.array(batch.lengths, dtype=np.int64))
        decoded = []
        for b, (tokens, log_probs) in enumerate(written_sequences(outputs)):
            entities = parse_groups(tokens, log_probs, self.config.vocabulary, [])
            self.outcomes["at the length limit" if len(tokens) >= limits[b] else "finished"] += 1
            decoded.append(resolve(entities, chosen[b].threshold, chosen[b].overlap))
        return decoded
