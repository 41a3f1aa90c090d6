"""Runs SetGNER's graphs for a batch of sentences (numpy in, numpy out): the encoder and detectors
once; words whose head probability reaches the threshold seed one decoder row each, all heads of
the batch in parallel; a head that starts one entity is decoded greedily, one that starts several
by beam search keeping that many hypotheses (adaptive beam search); parse.

The same program serves training-time evaluation (eager graphs), export parity and the service.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from nerserve.ner.archs.base import ProgramBase
from nerserve.ner.archs.feeds import encoder_feeds
from nerserve.ner.archs.pointer.decoding import (
    Grammar,
    Written,
    decode_rows,
    pack,
    parse_groups,
    sentence_inputs,
    written_sequences,
)
from nerserve.ner.archs.pointer.export import step_example
from nerserve.ner.archs.pointer.signatures import decoder_cache, sentence_states
from nerserve.ner.archs.setgen.config import HEAD, SetgenConfig, SetgenOptions
from nerserve.ner.decoding.overlap import resolve
from nerserve.ner.text.subword import Words
from nerserve.ner.types import Entity, EntitySet

MAX_ENTITY_WORDS = 16  # longest entity a head's sequence may write (pointers), bounds the loop


@dataclass
class SetgenBatch:
    encoder_inputs: dict[str, np.ndarray]
    lengths: list[int]
    padded_tokens: int


class SetgenProgram(ProgramBase[SetgenConfig, SetgenBatch, SetgenOptions]):
    def prepare(self, sentences: Sequence[Words]) -> SetgenBatch:
        inputs, encoded = encoder_feeds(self.subwords, sentences)
        return SetgenBatch(inputs, list(encoded.word_counts), encoded.padded_tokens)

    def heads(self, batch: SetgenBatch, part_probs: np.ndarray, count_probs: np.ndarray, options: list[SetgenOptions]):  # type: ignore[no-untyped-def]
        """(sentence, word, count) of every seed: p(head) ≥ its sentence's threshold; count ≥ 1."""
        thresholds = np.array([o.head_threshold for o in options], dtype=np.float32)
        chosen = (part_probs[..., HEAD] >= thresholds[:, None]) & (batch.encoder_inputs["word_mask"] > 0)
        sentence, word = np.nonzero(chosen)
        counts = np.maximum(count_probs[sentence, word].argmax(axis=-1), 1)
        return sentence.astype(np.int64), word.astype(np.int64), counts.astype(np.int64)

    def run(self, batch: SetgenBatch, options: SetgenOptions | Sequence[SetgenOptions] | None = None) -> dict[str, np.ndarray]:
        # on a GPU what every decoder step reads stays there (a no-op on the CPU)
        states = sentence_states(self.config.decoder_layers)
        encoded = self.graphs["encoder"].run(batch.encoder_inputs, keep_on_device=states)
        chosen = self.per_sentence(options, len(batch.lengths))
        sentence, word, counts = self.heads(batch, encoded["part_probs"], encoded["count_probs"], chosen)
        beams = np.array([chosen[s].beams if c > 1 else 1 for s, c in zip(sentence, counts, strict=True)], dtype=np.int64)
        beams = np.maximum(beams, np.where(beams > 1, counts, 1))  # at least as wide as the entities kept
        written = self._decode(batch, encoded, sentence, word, counts, beams)
        rows = np.array([w.row for w in written], dtype=np.int64)
        return {**encoded, "sequence_sentence": sentence[rows], "sequence_word": word[rows], **pack(written)}

    def _decode(
        self,
        batch: SetgenBatch,
        encoded: Mapping[str, np.ndarray],
        sentence: np.ndarray,
        word: np.ndarray,
        counts: np.ndarray,
        beams: np.ndarray,
    ) -> list[Written]:
        if len(sentence) == 0:
            return []
        config, vocabulary = self.config, self.config.vocabulary
        lengths = np.array(batch.lengths, dtype=np.int64)
        # after the given head pointer: up to MAX_ENTITY_WORDS - 1 pointers, a type or marker, the end
        longest = int(min((lengths[sentence] - word).max(), MAX_ENTITY_WORDS)) + 1
        return decode_rows(
            self.graphs["decoder"],
            sentence_inputs(batch.encoder_inputs, encoded, config.decoder_layers),
            sentence,
            vocabulary.first_pointer + word,
            word * config.position_interval,
            decoder_cache(config.decoder_layers, config.decoder_heads, config.decoder_dim),
            Grammar(vocabulary, lengths[sentence], many=False),
            longest,
            beams,
            counts,
        )

    def export_values(self, batch: SetgenBatch) -> dict[str, np.ndarray]:
        """Encoder inputs/outputs, and the decoder step's at its third step over 7 rows (a
        cache of two positions: every named axis ≥ 2 and distinct)."""
        encoded = self.graphs["encoder"].run(batch.encoder_inputs)
        shared = sentence_inputs(batch.encoder_inputs, encoded, self.config.decoder_layers)
        return {**batch.encoder_inputs, **encoded, **step_example(self.graphs["decoder"], shared, batch.lengths, self.config)}

    def decode(
        self,
        batch: SetgenBatch,
        outputs: Mapping[str, np.ndarray],
        options: SetgenOptions | Sequence[SetgenOptions] | None = None,
    ) -> list[EntitySet]:
        chosen = self.per_sentence(options, len(batch.lengths))
        vocabulary = self.config.vocabulary
        found: list[list[Entity]] = [[] for _ in batch.lengths]
        sentences, heads = outputs["sequence_sentence"], outputs["sequence_word"]
        # the head threshold again: outputs run at a looser one (dev tuning) hold a superset of
        # the rows, and a row's sequence does not depend on the other rows
        head_probs = outputs["part_probs"][sentences, heads, HEAD]
        passed = ~(head_probs < np.array([o.head_threshold for o in chosen], dtype=head_probs.dtype)[sentences])
        rows = zip(sentences.tolist(), heads.tolist(), passed.tolist(), written_sequences(outputs), strict=True)
        for sentence, head, passes, (tokens, log_probs) in rows:
            if not passes:
                continue
            entities = parse_groups(tokens, log_probs, vocabulary, [head])
            self.outcomes["entity" if entities else "no entity"] += 1
            found[sentence] += entities
        return [resolve(entities, chosen[b].threshold, chosen[b].overlap) for b, entities in enumerate(found)]
