"""Runs GNER's graphs for a batch of sentences (numpy in, numpy out): the prompt of each sentence
(instruction, its request's labels, its words) through the encoder once, then one decoder row per
sentence writing `word(tag)` for every word, greedy or by beam search, constrained or free; the
output is parsed, matched onto the input words (hierarchical matching) and read as BIO spans.

The same program serves training-time evaluation (eager graphs), export parity and the service.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property, lru_cache

import numpy as np

from nerserve.ner.archs.base import OptionError, ProgramBase
from nerserve.ner.archs.gner.config import GnerConfig, GnerOptions
from nerserve.ner.archs.gner.constraint import Constraint, SentenceGrammar, trie_of
from nerserve.ner.archs.gner.matching import align
from nerserve.ner.archs.gner.signatures import (
    ALL_LOGITS,
    ROW_INDEX,
    STATES,
    decoder_cache,
    row_cross_names,
    rows_names,
)
from nerserve.ner.archs.gner.tagging import Markers, Tag, TagCodec, bio_entities, parse_pairs, squeeze
from nerserve.ner.decoding.generation import BLOCKED, Loop, beam_search, greedy
from nerserve.ner.decoding.overlap import resolve
from nerserve.ner.graph import Value, cross_names
from nerserve.ner.text.chars import shape_id
from nerserve.ner.text.subword import Tokenized, Words
from nerserve.ner.types import Entity, EntitySet


@dataclass
class GnerBatch:
    sentences: list[Tokenized]
    lengths: list[int]
    padded_tokens: int  # the sentences' sub-words padded (the prompt comes with the request's labels, in `run`)


@dataclass(frozen=True)
class Prompts:
    """A batch's prompts as the decoder reads them: the padding mask [B, S] and each layer's
    cross-attention keys and values [B, H, S, hd] (device values on a GPU)."""

    mask: np.ndarray
    cross: dict[str, Value]

    @classmethod
    def of(cls, inputs: Mapping[str, np.ndarray], encoded: Mapping[str, Value], layers: int) -> Prompts:
        return cls(inputs["attention_mask"].astype(np.float32), {name: encoded[name] for name in cross_names(layers)})


@dataclass(frozen=True)
class Written:
    tokens: tuple[int, ...]  # generated, end excluded
    log_probs: tuple[float, ...]
    finished: bool


# the tokens an export example's steps score: their count apart from every other axis's size
EXAMPLE_VOCABULARY = np.array([0, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233], dtype=np.int64)


class LengthLimit:
    """Free generation's only rule: a row's last allowed token is the end."""

    def __init__(self, limits: np.ndarray, end: int) -> None:
        self.limits, self.end = limits, end

    def __call__(self, logits: np.ndarray, history: np.ndarray) -> np.ndarray:
        at_limit = history.shape[1] >= self.limits
        if not at_limit.any():
            return logits
        forced = np.full(logits.shape, BLOCKED, dtype=logits.dtype)
        forced[:, self.end] = 0.0
        return np.where(at_limit[:, None], forced, logits)

    def select(self, rows: np.ndarray) -> LengthLimit:
        return LengthLimit(self.limits[rows], self.end)


class GnerProgram(ProgramBase[GnerConfig, GnerBatch, GnerOptions]):
    # A window's target is ~5 tokens a word (word, "(", tag, ")"): 64 sub-words keep it inside the
    # decoder's 512 positions and a request's latency bounded; the prompt gets the rest.
    window_subwords = 64

    def check_options(self, options: GnerOptions) -> None:
        room = self.subwords.max_subwords - self.window_subwords - self.subwords.special_count
        needed = len(self.prompt(self.labels_of(options)))
        if needed > room:
            raise OptionError("labels", f"the label list takes {needed} tokens in the prompt, at most {room} fit")

    @cached_property  # tokenises "(" and ")": once per program, not per batch and sentence
    def markers(self) -> Markers:
        subwords = self.subwords
        start = subwords.prefix[0] if subwords.prefix else subwords.pad_id
        return Markers.of(subwords.tokenizer, start, subwords.suffix[-1])

    @lru_cache(maxsize=256)  # noqa: B019 - one program per model, label lists repeat across requests
    def codec(self, labels: tuple[str, ...]) -> TagCodec:
        return TagCodec(self.subwords.tokenizer, labels)

    @lru_cache(maxsize=256)  # noqa: B019
    def prompt(self, labels: tuple[str, ...]) -> tuple[int, ...]:
        """Instruction, label names (separated), sentence marker: the tokens before the sentence."""
        config, tokenizer = self.config, self.subwords.tokenizer

        def ids(text: str) -> list[int]:
            return tokenizer.encode(text, add_special_tokens=False).ids

        separator = ids(config.label_separator)
        tokens = ids(config.instruction)
        for index, label in enumerate(labels):
            tokens += (separator if index else []) + ids(label)
        return tuple(tokens + ids(config.sentence_marker))

    def every_token(self, step: Mapping[str, Value]) -> np.ndarray:
        """Free generation's scores of every token [rows, V], from a step's states."""
        return np.asarray(self.graphs["scores"].run({STATES: step[STATES]})[ALL_LOGITS])

    def labels_of(self, options: GnerOptions) -> tuple[str, ...]:
        return options.labels or self.config.labels

    def prepare(self, sentences: Sequence[Words]) -> GnerBatch:
        plain = [list(s) for s in sentences if not isinstance(s, Tokenized)]
        fresh = iter(self.subwords.tokenize(plain) if plain else [])
        ready = [s if isinstance(s, Tokenized) else next(fresh) for s in sentences]
        lengths = [len(s.words) for s in ready]
        longest = max((s.subwords for s in ready), default=0)
        return GnerBatch(ready, lengths, len(ready) * (longest + self.subwords.special_count))

    def encoder_inputs(self, batch: GnerBatch, labels: Sequence[tuple[str, ...]]) -> dict[str, np.ndarray]:
        rows: list[list[int]] = []
        shapes: list[list[int]] = []
        prefix, suffix = self.subwords.prefix, self.subwords.suffix
        for sentence, names in zip(batch.sentences, labels, strict=True):
            head = [*prefix, *self.prompt(names)]
            words = [token for piece in sentence.pieces for token in piece]
            rows.append([*head, *words, *suffix])
            word_shapes = [shape_id(w) for w, piece in zip(sentence.words, sentence.pieces, strict=True) for _ in piece]
            shapes.append([0] * len(head) + word_shapes + [0] * len(suffix))
        width = max(len(r) for r in rows)
        input_ids = np.full((len(rows), width), self.subwords.pad_id, dtype=np.int64)
        attention_mask = np.zeros((len(rows), width), dtype=np.int64)
        shape_ids = np.zeros((len(rows), width), dtype=np.int64)
        for b, (row, shape) in enumerate(zip(rows, shapes, strict=True)):
            input_ids[b, : len(row)], attention_mask[b, : len(row)], shape_ids[b, : len(row)] = row, 1, shape
        return {"input_ids": input_ids, "attention_mask": attention_mask, "shape_ids": shape_ids}

    def grammar(self, sentence: Tokenized, labels: tuple[str, ...]) -> SentenceGrammar:
        return SentenceGrammar(sentence.pieces, trie_of(self.codec(labels).sequences), self.markers)

    def limit(self, grammar: SentenceGrammar, labels: tuple[str, ...]) -> int:
        """The new-token bound of a sentence, from its length: per word its sub-words, "(", ")"
        and the longest tag of its request, then the end."""
        return grammar.steps(max(len(s) for s in self.codec(labels).sequences))

    def run(self, batch: GnerBatch, options: GnerOptions | Sequence[GnerOptions] | None = None) -> dict[str, np.ndarray]:
        chosen = self.per_sentence(options, len(batch.sentences))
        labels = [self.labels_of(o) for o in chosen]
        inputs = self.encoder_inputs(batch, labels)
        config = self.config
        # on a GPU the decoder's cross-attention keys and values stay there (a no-op on the CPU)
        encoded = self.graphs["encoder"].run(inputs, keep_on_device=cross_names(config.decoder_layers))
        prompts = Prompts.of(inputs, encoded, config.decoder_layers)
        written: dict[int, Written] = {}
        groups: dict[tuple[int, bool], list[int]] = {}
        for index, option in enumerate(chosen):
            groups.setdefault((option.beams, option.constrained), []).append(index)
        for (beams, constrained), rows in sorted(groups.items()):
            written.update(self.generate(batch, labels, prompts, np.array(rows, dtype=np.int64), beams, constrained))
        return {**encoded, **pack([written[i] for i in range(len(batch.sentences))])}

    def select_rows(self, index: np.ndarray, tensors: Mapping[str, Value]) -> dict[str, Value]:
        """Per-layer tensors' rows in `index` order, through the `rows` graph (on the device,
        where they are)."""
        taken, selected = rows_names(self.config.decoder_layers)
        feeds = {ROW_INDEX: index, **dict(zip(taken, tensors.values(), strict=True))}
        outputs = self.graphs["rows"].run(feeds, keep_on_device=selected)
        return {name: outputs[out] for name, out in zip(tensors, selected, strict=True)}

    def loop_inputs(self, prompts: Prompts, sentences: np.ndarray) -> dict[str, Value]:
        """The step graph's per-row prompt inputs for a loop whose rows read `sentences`: the
        encoder's own when they are the batch in order, else selected once for the whole loop."""
        names = row_cross_names(self.config.decoder_layers)
        cross = prompts.cross
        if not np.array_equal(sentences, np.arange(len(prompts.mask))):
            cross = self.select_rows(sentences, cross)
        return {"memory_mask": prompts.mask[sentences], **dict(zip(names, cross.values(), strict=True))}

    def generate(
        self,
        batch: GnerBatch,
        labels: Sequence[tuple[str, ...]],
        prompts: Prompts,
        rows: np.ndarray,
        beams: int,
        constrained: bool,
    ) -> dict[int, Written]:
        markers = self.markers
        grammars = [self.grammar(batch.sentences[r], labels[r]) for r in rows]
        limits = np.array([self.limit(g, labels[r]) for g, r in zip(grammars, rows, strict=True)], dtype=np.int64)
        slots = np.repeat(np.arange(len(rows)), beams)
        if constrained:
            rule: Constraint | LengthLimit = Constraint(grammars, slots)
        else:
            rule = LengthLimit(limits[slots], markers.end)
        config = self.config
        loop = Loop(
            self.graphs["decoder"],
            self.loop_inputs(prompts, rows[slots]),
            {},
            decoder_cache(config.decoder_layers, config.decoder_heads, config.head_dim),
            np.full(len(rows), markers.start, dtype=np.int64),
            markers.end,
            constraint=rule,
            reorder=self.select_rows,
            every_token=self.every_token,
            select_shared=lambda kept, _: self.loop_inputs(prompts, rows[slots][kept]),
        )
        out: dict[int, Written] = {}
        if beams == 1:
            generated = greedy(loop, int(limits.max()))
            chosen = generated.log_probs
            for i, row in enumerate(rows):
                ends = np.flatnonzero(generated.tokens[i] == markers.end)
                length = int(ends[0]) if len(ends) else generated.tokens.shape[1]
                out[int(row)] = Written(
                    tuple(generated.tokens[i, :length].tolist()), tuple(chosen[i, :length].tolist()), bool(len(ends))
                )
            return out
        for i, hypotheses in enumerate(beam_search(loop, int(limits.max()), beams, np.ones(len(rows), dtype=np.int64))):
            best = hypotheses[0]
            finished = bool(best.tokens) and best.tokens[-1] == markers.end
            cut = len(best.tokens) - 1 if finished else len(best.tokens)
            out[int(rows[i])] = Written(best.tokens[:cut], best.log_probs[:cut], finished)
        return out

    def export_values(self, batch: GnerBatch) -> dict[str, np.ndarray]:
        labels = [self.config.labels] * len(batch.sentences)
        inputs = self.encoder_inputs(batch, labels)
        encoded = self.graphs["encoder"].run(inputs)
        config = self.config
        rows = 7  # distinct from every other axis size (torch.export specialises equal sizes)
        prompts = Prompts.of(inputs, encoded, config.decoder_layers)
        row_sentence = np.arange(rows, dtype=np.int64)[::-1] % len(batch.sentences)
        per_row = self.loop_inputs(prompts, row_sentence)
        cache = decoder_cache(config.decoder_layers, config.decoder_heads, config.head_dim)
        feeds: dict[str, np.ndarray] = {}
        outputs: dict[str, np.ndarray] = {}
        past = cache.empty(rows)
        tokens = np.full(rows, self.markers.start, dtype=np.int64)
        for position in range(3):
            feeds = {
                **per_row,
                **past,
                "tokens": tokens,
                "positions": np.full(rows, position, dtype=np.int64),
                "vocabulary": EXAMPLE_VOCABULARY,
            }
            outputs = self.graphs["decoder"].run(feeds)
            past = cache.carry(outputs)
            tokens = inputs["input_ids"][row_sentence, position + 1]
        scores = self.graphs["scores"].run({STATES: outputs[STATES]})
        taken, selected = rows_names(config.decoder_layers)
        cross = list(prompts.cross.values())
        rows_graph = {ROW_INDEX: row_sentence, **dict(zip(taken, cross, strict=True))}
        rows_graph.update(zip(selected, [per_row[n] for n in row_cross_names(config.decoder_layers)], strict=True))
        return {**inputs, **encoded, **feeds, **outputs, **rows_graph, **scores}

    def decode(
        self, batch: GnerBatch, outputs: Mapping[str, np.ndarray], options: GnerOptions | Sequence[GnerOptions] | None = None
    ) -> list[EntitySet]:
        chosen = self.per_sentence(options, len(batch.sentences))
        decoded = []
        for b, sentence in enumerate(batch.sentences):
            kept = outputs["sequence_tokens"][b] >= 0
            tokens = outputs["sequence_tokens"][b][kept].tolist()
            log_probs = outputs["sequence_log_probs"][b][kept].tolist()
            entities, tier = self.structure(sentence, tokens, log_probs, self.labels_of(chosen[b]))
            self.outcomes[tier] += 1
            decoded.append(resolve(entities, 0.0, chosen[b].overlap))
        return decoded

    def structure(
        self,
        sentence: Tokenized,
        tokens: list[int],
        log_probs: list[float],
        labels: tuple[str, ...],
        back_tokenise: bool = True,
        use_lcs: bool = True,
    ) -> tuple[list[Entity], str]:
        """Generated tokens → entities on the input words, and the matching tier used. The two
        flags are the ablations of the paper's Table 6."""
        tokenizer = self.subwords.tokenizer
        pairs = parse_pairs(tokenizer.decode(tokens))
        codec = self.codec(labels)
        if back_tokenise:
            words = [squeeze(tokenizer.decode(list(piece))) for piece in sentence.pieces]
            generated = [squeeze(word) for word, _ in pairs]
        else:
            words, generated = list(sentence.words), [word for word, _ in pairs]
        matched, tier = align(words, generated, use_lcs)
        tags = [codec.read(pairs[matched[i]][1]) if i in matched else Tag(False, None) for i in range(len(words))]
        confidence = self.tag_confidence(tokens, log_probs, len(pairs))
        entities = []
        for label, start, end in bio_entities(tags):
            scores = [confidence[matched[i]] for i in range(start, end)]
            entities.append(Entity(label, ((start, end),), float(np.exp(np.mean(scores)))))
        return entities, tier

    def tag_confidence(self, tokens: list[int], log_probs: list[float], pairs: int) -> list[float]:
        """Mean log-probability of each written tag's tokens (between a "(" and the next ")"), in
        order; the sequence's mean for every pair when the count does not match the parse."""
        markers = self.markers
        opening, closing = markers.open[-1], markers.close[0]
        groups: list[list[float]] = []
        inside: list[float] | None = None
        for index, token in enumerate(tokens):
            if token == opening and (index + 1 >= len(tokens) or tokens[index + 1] != opening):
                inside = []
            elif token == closing and inside is not None:
                groups.append(inside or [0.0])
                inside = None
            elif inside is not None:
                inside.append(log_probs[index])
        if len(groups) != pairs:
            mean = float(np.mean(log_probs)) if log_probs else 0.0
            return [mean] * pairs
        return [float(np.mean(g)) for g in groups]


def pack(written: list[Written]) -> dict[str, np.ndarray]:
    """Written sequences as arrays: integer tokens padded with -1, their log-probabilities, and
    whether each ended by itself (the program's outputs: export parity compares them exactly)."""
    steps = max((len(w.tokens) for w in written), default=1) or 1
    tokens = np.full((len(written), steps), -1, dtype=np.int64)
    scores = np.zeros((len(written), steps), dtype=np.float32)
    for i, w in enumerate(written):
        tokens[i, : len(w.tokens)] = w.tokens
        scores[i, : len(w.log_probs)] = w.log_probs
    return {
        "sequence_tokens": tokens,
        "sequence_log_probs": scores,
        "sequence_finished": np.array([w.finished for w in written]),
    }
