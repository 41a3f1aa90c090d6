"""Running the pointer decoder's step graph and reading what it wrote (numpy), for setgen and
bartner: the grammar that keeps every sequence parseable, greedy or beam decoding over groups of
rows, and the parse of pointer/type groups into typed word fragments."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from nerserve.ner.archs.pointer.signatures import sentence_states
from nerserve.ner.archs.pointer.vocabulary import END, FRAGMENT, NULL, START, Vocabulary, pointer_mask
from nerserve.ner.decoding.generation import BLOCKED, Loop, beam_search, greedy
from nerserve.ner.graph import Graph, KeyValueCache, Value
from nerserve.ner.types import Entity, fragments_of


@dataclass(frozen=True)
class Grammar:
    """Which tokens may follow, per row: one entity written from its head word, or a fragment/null
    marker (SetGNER, `many` false), or pointer groups each closed by its type, then the end
    (BARTNER, `many` true)."""

    vocabulary: Vocabulary
    lengths: np.ndarray  # [rows] words of each row's sentence
    many: bool
    # [rows] most tokens a row may write (its last one the end, forced): a row's own bound, so
    # that a sentence's output never depends on the longest sentence of its batch
    limits: np.ndarray | None = None

    def __call__(self, logits: np.ndarray, history: np.ndarray) -> np.ndarray:
        vocabulary = self.vocabulary
        first_pointer = vocabulary.first_pointer
        last = history[:, -1]
        is_pointer = last >= first_pointer
        # the last pointer of the group being written (-1: none yet)
        last_word = np.where(is_pointer, last - first_pointer, -1)
        allowed = np.zeros(logits.shape, dtype=bool)
        width = logits.shape[1] - first_pointer
        words_ok = pointer_mask(self.lengths, last_word, width)
        closed = ~is_pointer & (last != START)  # a type, a marker or the end was written last
        # after a pointer: more pointers to the right, a type; SetGNER also fragment / null
        allowed[is_pointer, vocabulary.first_type : first_pointer] = True
        if not self.many:
            allowed[is_pointer, FRAGMENT] = allowed[is_pointer, NULL] = True
        allowed[:, first_pointer:] = words_ok & is_pointer[:, None]
        if self.many:
            # at the start and after a type: a new group (any word) or the end
            opening = (last == START) | ((last >= vocabulary.first_type) & ~is_pointer)
            allowed[opening, first_pointer:] = pointer_mask(self.lengths[opening], np.full(opening.sum(), -1), width)
            allowed[opening, END] = True
            allowed[last == END, END] = True
        else:
            allowed[closed, END] = True
        if self.limits is not None:
            at_limit = history.shape[1] >= self.limits  # the next token is the row's last
            allowed[at_limit] = False
            allowed[at_limit, END] = True
        return np.where(allowed, logits, BLOCKED)

    def select(self, rows: np.ndarray) -> Grammar:
        """The grammar of `rows` alone (a loop's rows that have not yet finished)."""
        return replace(self, lengths=self.lengths[rows], limits=None if self.limits is None else self.limits[rows])


@dataclass(frozen=True)
class Written:
    """What the decoder wrote for one row: tokens after the first (end included) and their log-probabilities."""

    row: int
    tokens: tuple[int, ...]
    log_probs: tuple[float, ...]


def decode_rows(
    step: Graph,
    shared: Mapping[str, Value],
    row_sentence: np.ndarray,
    first: np.ndarray,
    offsets: np.ndarray,
    cache: KeyValueCache,
    grammar: Grammar,
    max_steps: int,
    beams: np.ndarray,
    keep: np.ndarray,
) -> list[Written]:
    """Rows with beams = 1 greedily, together; the others by beam search, grouped by width.
    A row with keep = k yields its k best sequences (k entities from one head)."""
    written: list[Written] = []
    for width in sorted(set(beams.tolist())):
        rows = np.flatnonzero(beams == width)
        loop = Loop(
            step,
            shared,
            {"row_sentence": row_sentence[rows]},
            cache,
            first[rows],
            END,
            offsets[rows],
            constraint=Grammar(
                grammar.vocabulary,
                np.repeat(grammar.lengths[rows], width),
                grammar.many,
                None if grammar.limits is None else np.repeat(grammar.limits[rows], width),
            ),
        )
        if width == 1:
            generated = greedy(loop, max_steps)
            chosen = generated.log_probs
            for i, row in enumerate(rows):
                length = int(np.argmax(generated.tokens[i] == END)) + 1 if generated.finished[i] else generated.tokens.shape[1]
                written.append(
                    Written(int(row), tuple(generated.tokens[i, :length].tolist()), tuple(chosen[i, :length].tolist()))
                )
        else:
            for i, hypotheses in enumerate(beam_search(loop, max_steps, int(width), keep[rows])):
                written += [Written(int(rows[i]), h.tokens, h.log_probs) for h in hypotheses]
    return sorted(written, key=lambda w: w.row)


def sentence_inputs(encoder_inputs: Mapping[str, np.ndarray], encoded: Mapping[str, Value], layers: int) -> dict[str, Value]:
    """The step graph's per-sentence inputs: the word mask and the encoder's sentence states."""
    return {"memory_mask": encoder_inputs["word_mask"], **{name: encoded[name] for name in sentence_states(layers)}}


def written_sequences(outputs: Mapping[str, np.ndarray]) -> Iterator[tuple[list[int], list[float]]]:
    """Each row's written tokens and their log-probabilities as Python lists (one conversion for
    the batch, not one a row), without the padding (-1) `pack` put after them."""
    for tokens, log_probs in zip(outputs["sequence_tokens"].tolist(), outputs["sequence_log_probs"].tolist(), strict=True):
        length = tokens.index(-1) if tokens[-1] == -1 else len(tokens)
        yield tokens[:length], log_probs[:length]


def parse_groups(
    tokens: Sequence[int], log_probs: Sequence[float], vocabulary: Vocabulary, seed_words: list[int]
) -> list[Entity]:
    """Pointer groups closed by a type → entities (score: geometric mean of the group's token
    probabilities). `seed_words` start the first group (SetGNER: the head word, given not
    generated). Markers, the end and groups without a type are no entity."""
    entities: list[Entity] = []
    words, scores = list(seed_words), []
    for token, logp in zip(tokens, log_probs, strict=True):
        if token >= vocabulary.first_pointer:
            words.append(token - vocabulary.first_pointer)
            scores.append(logp)
        elif vocabulary.is_type(token) and words and all(a < b for a, b in itertools.pairwise(words)):
            scores.append(logp)
            score = math.exp(sum(scores) / len(scores))
            entities.append(Entity(vocabulary.label(token), fragments_of(words), score))
            words, scores = [], []
        else:
            words, scores = [], []
            if token == END:
                break
    return entities


def pack(written: list[Written]) -> dict[str, np.ndarray]:
    """Written sequences as arrays: integer tokens padded with -1, and their log-probabilities
    (the program's outputs: export parity compares them, integers exactly)."""
    steps = max((len(w.tokens) for w in written), default=1)
    tokens = np.full((len(written), steps), -1, dtype=np.int64)
    scores = np.zeros((len(written), steps), dtype=np.float32)
    for i, w in enumerate(written):
        tokens[i, : len(w.tokens)] = w.tokens
        scores[i, : len(w.log_probs)] = w.log_probs
    return {"sequence_tokens": tokens, "sequence_log_probs": scores}
