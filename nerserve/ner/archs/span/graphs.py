"""The span-proposal graph: all seed spans → the candidates the filter passes, their adjusted spans
and class probabilities. Gathers only: no Python loops over batch or spans.

Four choices keep it cheap enough for CPU training and serving, without changing what the paper's
heads see ([max-pool of the span; left boundary word; right boundary word; context] → MLP):

- the MLPs' first linear layer is applied per *word* and per sentence, then gathered per span
  (a linear map of a concatenation is the sum of the maps of its parts). The pooled part is the
  max over the span of linearly projected word vectors (max-pool of learned features) rather than
  the projection of the max-pool: K spans cost gathers, not K matrix products of width 4·D;
- span max-pooling uses a sparse table (range-maximum query): level j holds the max over
  [i, i + 2^j), so any span [s, e) is max(level_j[s], level_j[e - 2^j]) with j = ⌊log2(e - s)⌋.
  Exact, O(N log N) memory instead of the O(K·N) masks of the official code, and valid for
  adjusted spans of any length (the seeds' scorers build only the levels seeds need);
- the filter scores a sentence's own seeds only, not the padding up to the batch's longest
  sentence's seed count: a batch of mixed lengths, as a server's are, is mostly padding there
  (256 CoNLL-2003 test sentences in arrival order: 15,270 seeds of a [B, K] of 156,160);
- only the seeds the filter passes (a few percent) are adjusted and classified, and only they
  leave the graph, since decoding reads nothing else: the regressor's and classifier's span work
  shrinks by as much, and a device copies the host the candidates, not [B, K] tensors.

Served eagerly, the graph is fused (`SpanProposalGraph.fuse_for_eager`), for fewer operators, each
of which Python dispatches and, on a GPU, launches as a kernel: the three scorers' per-word layers
are one matrix product, their per-sentence layers another, and their max-pools read one range-max
table, built by shifted slices only up to the levels the batch's sentences can use and laid out by
word, then level, so that a span's two reads are found from the row of its first and of its last
word. The filter and the regressor, which read the same seeds, score them together, and every real
seed is adjusted and classified: the filter's verdict, whose count a GPU must hand the host (a wait
for the device), is read last and only picks the rows that leave the graph, so that the rest of the
pass is launched while the device still works rather than after it. Its real seeds and words' rows
come from the host (`eager_indices`). And it works on the words' rows (`WordRows`: each sentence's
words one after another) rather than on [B, N], which a GPU's whole batch of mixed lengths holds
mostly as padding. The values are the same. Exported graphs keep the trained form, which the CPU
runs in groups of similar lengths (docs/decisions/gpu-engine.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from nerserve.ner.torch_graph import host_array_of, to_tensors

_PAD_VALUE = -1e4  # far below any projected word feature; representable in fp16 too


def range_max_table(states: torch.Tensor, word_mask: torch.Tensor, levels: int) -> torch.Tensor:
    """[B, N, D] → [B, levels·N, D]: level j, position i = max of states[i : i + 2^j]."""
    return torch.cat(doubled_levels(masked_words(states, word_mask), levels), dim=1)


def masked_words(states: torch.Tensor, word_mask: torch.Tensor) -> torch.Tensor:
    """The range-max table's level 0: positions past a sentence's words far below any real value."""
    return states.masked_fill(word_mask.unsqueeze(-1) == 0, _PAD_VALUE)


def doubled_levels(level: torch.Tensor, levels: int) -> list[torch.Tensor]:
    """Level 0 [B, N, D] → levels 0 … levels - 1, level j + 1 the max of level j at i and at
    i + 2^j, a position past N reading the last (a traced or exported graph's levels may reach past
    a batch's N)."""
    n = level.shape[1]
    tables = [level]
    if levels == 1:
        return tables
    steps = 2 ** torch.arange(levels - 1, device=level.device).unsqueeze(1)
    shifted = at_most(torch.arange(n, device=level.device) + steps, n - 1)  # [levels - 1, N]
    for j in range(levels - 1):
        level = torch.maximum(level, level.index_select(1, shifted[j]))
        tables.append(level)
    return tables


def range_max_by_row(rows: torch.Tensor, levels: int) -> torch.Tensor:
    """[R, D] → [R·levels, D], row r·levels + j = max of rows[r : r + 2^j] (past R: far below any
    real value). Rows run on from one sentence into the next; a span's two reads (`range_max`) never
    do. Eagerly each level is one maximum of two shifted slices of the rows padded once; a graph of
    fixed levels shifts by index (`doubled_levels`)."""
    count, size = rows.shape
    if fixed_shape_graph():
        tables = [level.squeeze(0) for level in doubled_levels(rows.unsqueeze(0), levels)]
    else:
        padded = F.pad(rows, (0, 0, 0, 2 ** (levels - 1) - 1), value=_PAD_VALUE)
        tables = [rows]
        for j in range(levels - 1):
            padded = torch.maximum(padded[: -(2**j)], padded[2**j :])
            tables.append(padded[:count])
    return torch.stack(tables, dim=1).reshape(count * levels, size)


def at_most(values: torch.Tensor, bound: int) -> torch.Tensor:
    """min(VALUES, BOUND) for a BOUND read from a shape. Not `clamp(max=bound)`: a trace records the
    shape as a 0-dim host tensor, which `clamp` would then take as a tensor bound, and CUDA refuses a
    host tensor there (a TorchScript graph traced on the CPU stopped on a GPU); a bound made on the
    values' device is one that every device takes."""
    return torch.minimum(values, values.new_full((), bound))


def fixed_shape_graph() -> bool:
    """Whether the graph is being traced, exported or compiled: its sizes are then one example's."""
    return torch.jit.is_tracing() or torch.onnx.is_in_onnx_export() or torch.compiler.is_compiling()


def levels_for(words: int, levels: int) -> int:
    """The range-max levels spans of sentences padded to WORDS can use (⌊log2 words⌋ + 1), at most
    LEVELS. A traced, exported or compiled graph keeps all LEVELS: its WORDS is one example's."""
    if fixed_shape_graph():
        return levels
    return min(levels, max(1, words.bit_length()))


def range_max(
    table: torch.Tensor,
    n: int,
    sentence: torch.Tensor,
    starts: torch.Tensor,
    ends: torch.Tensor,
    levels: int,
    length_levels: torch.Tensor,
) -> torch.Tensor:
    """Max-pool of spans [starts, ends) (ends > starts) of sentences `sentence`, [M] each → [M, D].
    LENGTH_LEVELS: `level_of_length` for at least LEVELS levels."""
    level = table_level(ends - starts, levels, length_levels)
    width = torch.pow(2, level)
    base = sentence * (levels * n) + level * n
    return torch.maximum(word_rows(table, base + starts), word_rows(table, base + ends - width))


def level_of_length(levels: int) -> torch.Tensor:
    """⌊log2(length)⌋ for every length up to the top level's width, 2^(levels - 1) (0 for length
    0): a constant each scorer holds (`SpanScorer.length_levels`), so that a span's level is one
    lookup. Counting the powers of two each span's length reaches would instead cost a pass five
    operators a scorer (a kernel each on a GPU), and reduce over an empty tensor when no seed passes
    the filter, which ONNX Runtime before 1.32 (onnxruntime-gpu's newest is 1.31.1) answers
    unreduced, [0, L] for [0], and the graph then fails."""
    powers = 2 ** torch.arange(1, levels)
    return (torch.arange(2 ** (levels - 1) + 1).unsqueeze(-1) >= powers).sum(-1)


def table_level(lengths: torch.Tensor, levels: int, length_levels: torch.Tensor) -> torch.Tensor:
    """⌊log2(length)⌋ capped at levels - 1, for lengths ≥ 1, read from LENGTH_LEVELS
    (`level_of_length` for LEVELS levels or more: a length past the top level's width reads the top
    level's)."""
    return length_levels.index_select(0, lengths.clamp(max=2 ** (levels - 1)))


def word_rows(states: torch.Tensor, flat_index: torch.Tensor) -> torch.Tensor:
    """states [B, N, D], flat_index [M] (sentence · N + position) → [M, D]: one index_select."""
    return states.reshape(-1, states.shape[-1]).index_select(0, flat_index)


def every_span(spans: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, K, 2] → each span's sentence [B·K] and the spans [B·K, 2]."""
    batch, k = spans.shape[:2]
    sentence = torch.arange(batch, device=spans.device).unsqueeze(1).expand(batch, k).reshape(-1)
    return sentence, spans.reshape(-1, 2)


@dataclass(frozen=True)
class WordLayers:
    """A scorer's first layer applied per word, [B, *, hidden] each (views of a fused product may
    be strided): the range-max table of its pooled part (`levels` levels), its left and right
    boundary parts, and the span lengths' levels in that table."""

    table: torch.Tensor
    levels: int
    left: torch.Tensor
    right: torch.Tensor
    length_levels: torch.Tensor  # level_of_length for at least `levels` levels


class SpanScorer(nn.Module):
    """MLP([max-pool; left word; right word; context]) → outputs, factorised per word (see above).
    LEVELS: the range-max table's, enough for the longest span it is asked to pool."""

    def __init__(self, word_size: int, context_size: int, hidden: int, outputs: int, levels: int, outer: bool) -> None:
        super().__init__()
        self.pool = nn.Linear(word_size, hidden)
        self.left = nn.Linear(word_size, hidden, bias=False)
        self.right = nn.Linear(word_size, hidden, bias=False)
        self.context = nn.Linear(context_size, hidden, bias=False)
        self.activation = nn.GELU()
        self.out = nn.Linear(hidden, outputs)
        self.levels = levels
        self.outer = outer  # boundary words just outside the span (regressor) or inside it
        # a constant of the graph, not a weight: left out of checkpoints, moved with the module
        self.length_levels: torch.Tensor
        self.register_buffer("length_levels", level_of_length(levels), persistent=False)

    def forward(
        self, states: torch.Tensor, context: torch.Tensor, word_mask: torch.Tensor, spans: torch.Tensor
    ) -> torch.Tensor:
        """Every span of every sentence, [B, K, 2] → [B, K, outputs]."""
        return self.every_span_scores(self.word_layers(states, word_mask), self.context(context), spans)

    def every_span_scores(self, layers: WordLayers, sentence_layer: torch.Tensor, spans: torch.Tensor) -> torch.Tensor:
        """Spans [B, K, 2] of every sentence, from the first layer's per-word and per-sentence
        parts → [B, K, outputs]."""
        batch, k = spans.shape[:2]
        words = self.span_words(layers, *every_span(spans)).reshape(batch, k, -1)
        return self.score(words + sentence_layer.unsqueeze(1))

    def chosen_span_scores(
        self, layers: WordLayers, sentence_layer: torch.Tensor, sentence: torch.Tensor, spans: torch.Tensor
    ) -> torch.Tensor:
        """Chosen spans only: span m, [M, 2], of sentence `sentence[m]` → [M, outputs]."""
        return self.score(self.span_words(layers, sentence, spans) + sentence_layer.index_select(0, sentence))

    def word_layers(self, states: torch.Tensor, word_mask: torch.Tensor) -> WordLayers:
        table = range_max_table(self.pool(states), word_mask, self.levels)
        return WordLayers(table, self.levels, self.left(states), self.right(states), self.length_levels)

    def span_words(self, layers: WordLayers, sentence: torch.Tensor, spans: torch.Tensor) -> torch.Tensor:
        """The first layer's part from spans' words, read from the per-word layers: [M, hidden]."""
        n = layers.left.shape[1]
        starts, ends = spans[:, 0], spans[:, 1]
        if self.outer:
            left, right = torch.clamp(starts - 1, min=0), at_most(ends, n - 1)
        else:
            left, right = starts, ends - 1
        base = sentence * n
        return (
            range_max(layers.table, n, sentence, starts, ends, layers.levels, layers.length_levels)
            + word_rows(layers.left, base + left)
            + word_rows(layers.right, base + right)
        )

    def score(self, first_layer: torch.Tensor) -> torch.Tensor:
        return self.out(self.activation(first_layer))


class SpanProposalGraph(nn.Module):
    """The filter scores every real seed; the regressor and the classifier read only the seeds decoding
    will (those the filter passes at each sentence's `filter_threshold`: a few percent; fused for
    eager inference, the regressor scores every real seed beside the filter: `fused_forward`), and
    only those candidates come out: (sentence, seed) of each, its adjusted span, its class
    probabilities, sentence by sentence in seed order. Without thresholds (tests) every seed is a
    candidate. Training calls the scorers itself (`span/loss.py`)."""

    # served with traced heads (ner.traced_heads), the fused proposal from its indices on is traced:
    # no Python branch on a batch's sizes or values there (traced, `levels_for` keeps every level)
    TRACED_PART: ClassVar[tuple[str, str]] = ("fused_forward", "its proposal from its indices on")
    # served with compiled heads (ner.compiled_heads), the same part: its filter's `nonzero` captured
    COMPILED_PARTS: ClassVar[tuple[str, ...]] = ("fused_forward",)

    def __init__(
        self, word_size: int, context_size: int, n_classes: int, hidden: int, dropout: float, levels: int, max_width: int
    ) -> None:
        super().__init__()
        seed_levels = min(levels, max_width.bit_length())  # seeds are at most max_width words: exact
        self.filter = SpanScorer(word_size, context_size, hidden, 2, seed_levels, outer=False)
        self.regressor = SpanScorer(word_size, context_size, hidden, 2, seed_levels, outer=True)
        # adjusted spans may be longer than any seed
        self.classifier = SpanScorer(word_size, context_size, hidden, n_classes + 1, levels, outer=False)  # 0 = none
        self.dropout = nn.Dropout(dropout)
        self.hidden = hidden
        # set by fuse_for_eager: the scorers' per-word layers [pools | lefts | rights] and per-sentence layers
        self.fused_words: nn.Linear | None = None
        self.fused_context: nn.Linear | None = None
        # fused_forward traced to TorchScript (ner.traced_heads)
        self.traced_part: Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]] | None = None
        self.last_read_offsets: torch.Tensor | None
        self.register_buffer("last_read_offsets", None, persistent=False)

    @property
    def scorers(self) -> tuple[SpanScorer, SpanScorer, SpanScorer]:
        return self.filter, self.regressor, self.classifier

    def fuse_for_eager(self) -> None:
        """For eager inference only: the three scorers' per-word layers as one product, pools first
        so that one range-max table holds the three, and their per-sentence layers as another."""
        if self.fused_words is not None:
            return
        pools, lefts, rights = zip(*((s.pool, s.left, s.right) for s in self.scorers), strict=True)
        weight = torch.cat([layer.weight for layer in (*pools, *lefts, *rights)])
        bias = torch.cat([p.bias for p in pools if p.bias is not None] + [weight.new_zeros(6 * self.hidden)])
        context_weight = torch.cat([s.context.weight for s in self.scorers])
        self.fused_words = nn.Linear(weight.shape[1], weight.shape[0], device=weight.device, dtype=weight.dtype)
        self.fused_context = nn.Linear(
            context_weight.shape[1], context_weight.shape[0], bias=False, device=weight.device, dtype=weight.dtype
        )
        with torch.no_grad():
            self.fused_words.weight.copy_(weight)
            self.fused_words.bias.copy_(bias)
            self.fused_context.weight.copy_(context_weight)
        # by a table of L levels and a span's length: where its max-pool's second read lies from
        # its last word's row, (1 - 2^level)·L + level (`span_reads`)
        levels, length_levels = self.classifier.levels, self.classifier.length_levels
        self.last_read_offsets = torch.stack(
            [(1 - 2**length_levels) * table_levels + length_levels for table_levels in range(levels + 1)]
        )

    def first_layers(
        self, states: torch.Tensor, context: torch.Tensor, word_mask: torch.Tensor
    ) -> tuple[list[WordLayers], list[torch.Tensor]]:
        """Each scorer's per-word layers and per-sentence layer [B, hidden] (filter, regressor,
        classifier), in the trained form."""
        return [s.word_layers(states, word_mask) for s in self.scorers], [s.context(context) for s in self.scorers]

    def regularise(self, states: torch.Tensor, context: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Dropout on the word and context vectors, before spans are built from them."""
        return self.dropout(states), self.dropout(context)

    @staticmethod
    def adjust(seeds: torch.Tensor, offsets: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """seed + round(offset), clipped to the sentence; a span left empty reverts to its seed.
        `lengths`: each seed's sentence length, in the shape of `seeds[..., 0]` or broadcast to it."""
        moved = seeds + torch.round(offsets).to(seeds.dtype)
        starts = torch.minimum(torch.clamp(moved[..., 0], min=0), lengths - 1)
        ends = torch.maximum(torch.minimum(moved[..., 1], lengths), torch.ones_like(lengths))
        legal = starts < ends
        starts = torch.where(legal, starts, seeds[..., 0])
        ends = torch.where(legal, ends, seeds[..., 1])
        return torch.stack([starts, ends], dim=-1)

    def forward(
        self,
        word_states: torch.Tensor,
        context: torch.Tensor,
        word_mask: torch.Tensor,
        seeds: torch.Tensor,
        seed_mask: torch.Tensor,
        filter_threshold: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self.fused_words is not None:
            fused = self.traced_part or self.fused_forward
            return fused(word_states, context, filter_threshold, *eager_indices(seeds, seed_mask, word_mask))
        candidates, picked = real_seeds(seeds, seed_mask)
        word_states, context = self.regularise(word_states, context)
        (filter_words, regressor_words, classifier_words), (filter_context, regressor_context, classifier_context) = (
            self.first_layers(word_states, context, word_mask)
        )
        sentence = candidates[:, 0]
        if filter_threshold is not None:
            filter_logits = self.filter.chosen_span_scores(filter_words, filter_context, sentence, picked)
            passed = passed_by_filter(filter_logits, filter_threshold, sentence)
            candidates, picked = candidates.index_select(0, passed), picked.index_select(0, passed)
            sentence = candidates[:, 0]
        offsets = self.regressor.chosen_span_scores(regressor_words, regressor_context, sentence, picked)
        spans = self.adjust(picked, offsets, sentence_lengths(word_mask, sentence, picked.dtype))
        class_logits = self.classifier.chosen_span_scores(classifier_words, classifier_context, sentence, spans)
        return candidates, spans, torch.softmax(class_logits, dim=-1)

    def fused_forward(
        self,
        word_states: torch.Tensor,
        context: torch.Tensor,
        filter_threshold: torch.Tensor | None,
        candidates: torch.Tensor,
        picked: torch.Tensor,
        row_flat: torch.Tensor,
        row_first: torch.Tensor,
        row_last: torch.Tensor,
        row_lengths: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """`forward` for eager inference (fuse_for_eager), from the real seeds (`candidates`, their
        spans `picked`) and the words' rows (`WordRows`' fields), as `eager_indices` gives them: the
        same outputs in fewer operators, on the words' rows rather than on [B, N]. The regressor
        scores every real seed beside the filter, which reads the same rows, and the classifier
        every adjusted seed; the filter's verdict then picks the rows that leave (see the module's
        docstring)."""
        assert self.fused_words is not None and self.fused_context is not None
        h, n = self.hidden, word_states.shape[1]
        levels = levels_for(n, self.classifier.levels)
        rows = WordRows(row_flat, row_first, row_last, row_lengths, n)
        # [W, 9h]: pools, lefts, rights; filter, regressor, classifier
        words = self.fused_words(word_states.reshape(-1, word_states.shape[2]).index_select(0, rows.flat))
        pools = range_max_by_row(words[:, : 3 * h], levels)
        contexts = self.fused_context(context)
        sentence = candidates[:, 0]
        reads = self.span_reads(rows, sentence, picked, levels, outside=True)
        # the filter's boundary words are a span's first and last; the regressor's those just outside it
        first = first_layer(
            reads,
            pools[:, : 2 * h],
            (words[:, 3 * h : 4 * h], words[:, 4 * h : 5 * h]),
            (words[:, 6 * h : 7 * h], words[:, 7 * h : 8 * h]),
            contexts[:, : 2 * h].index_select(0, sentence),
        )
        hidden = self.filter.activation(first)  # the scorers' activations are the same GELU
        filter_logits, offsets = self.filter.out(hidden[:, :h]), self.regressor.out(hidden[:, h:])
        spans = self.adjust(picked, offsets, rows.lengths.index_select(0, sentence))
        first = first_layer(
            self.span_reads(rows, sentence, spans, levels),
            pools[:, 2 * h :],
            (words[:, 5 * h : 6 * h],),
            (words[:, 8 * h :],),
            contexts[:, 2 * h :].index_select(0, sentence),
        )
        class_probs = torch.softmax(self.classifier.score(first), dim=-1)
        if filter_threshold is None:
            return candidates, spans, class_probs
        passed = passed_by_filter(filter_logits, filter_threshold, sentence)
        return candidates.index_select(0, passed), spans.index_select(0, passed), class_probs.index_select(0, passed)

    def span_reads(
        self, rows: WordRows, sentence: torch.Tensor, spans: torch.Tensor, levels: int, outside: bool = False
    ) -> SpanReads:
        """Where spans [M, 2] of sentences `sentence` [M] read the words' rows and their range-max
        table of LEVELS levels (`range_max_by_row`); with OUTSIDE, the words just outside them too."""
        assert self.last_read_offsets is not None
        length_levels = self.classifier.length_levels
        starts, ends = spans[:, 0], spans[:, 1]
        lengths = ends - starts
        if fixed_shape_graph() or rows.longest >= length_levels.shape[0]:
            lengths = lengths.clamp(max=length_levels.shape[0] - 1)  # past the top level's width: its level
        first_row = rows.first.index_select(0, sentence)
        first_word, last_word = first_row + starts, first_row + (ends - 1)
        level = length_levels.index_select(0, lengths)
        last_read = last_word * levels + self.last_read_offsets[levels].index_select(0, lengths)
        reads = SpanReads(first_word, last_word, first_word * levels + level, last_read)
        if not outside:
            return reads
        # as SpanScorer.span_words reads a padded row: the word before the span's first (its first at
        # the row's start) and the row after its last (`WordRows`)
        before = torch.maximum(first_word - 1, first_row)
        after = torch.minimum(last_word + 1, rows.last.index_select(0, sentence))
        return dataclasses.replace(reads, before=before, after=after)


def real_seeds(seeds: torch.Tensor, seed_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The real seeds only: [V, 2] (sentence, seed), row-major, and their spans [V, 2]. A batch's
    sentences are padded to its longest's seed count, which in a batch of mixed lengths is most of
    [B, K]."""
    candidates = torch.nonzero(seed_mask > 0)
    return candidates, seeds.reshape(-1, 2).index_select(0, candidates[:, 0] * seeds.shape[1] + candidates[:, 1])


def passed_by_filter(filter_logits: torch.Tensor, filter_threshold: torch.Tensor, sentence: torch.Tensor) -> torch.Tensor:
    """The rows of seeds whose p(entity) is above their sentence's threshold, [P]."""
    filter_prob = torch.softmax(filter_logits, dim=-1)[:, 1]
    return torch.nonzero(filter_prob > filter_threshold.index_select(0, sentence)).squeeze(1)


def sentence_lengths(word_mask: torch.Tensor, sentence: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Each span's sentence's word count, [M], in DTYPE (its spans')."""
    return word_mask.sum(dim=1).to(dtype).index_select(0, sentence)


@dataclass(frozen=True)
class WordRows:
    """A batch's word states [B, N, D] as rows: each sentence's words, then the position after its
    last word, sentence after sentence. That one row more is what a padded row holds there (or,
    in the batch's longest sentence, its last word again): a span's outer right word, which the
    trained form reads at the padded row. Only the rows spans read are then projected and tabled,
    where [B, N] holds a batch of mixed lengths mostly as padding (a few long sentences make every
    row as long)."""

    flat: torch.Tensor  # [W'] the rows' positions in [B·N]
    first: torch.Tensor  # [B] each sentence's first row
    last: torch.Tensor  # [B] each sentence's last row: the one after its words, or its last word
    lengths: torch.Tensor  # [B] each sentence's words
    longest: int  # N

    @classmethod
    def of(cls, word_mask: torch.Tensor) -> WordRows:
        lengths = word_mask.sum(dim=1).to(torch.int64)
        taken = torch.arange(word_mask.shape[1], device=word_mask.device).unsqueeze(0) <= lengths.unsqueeze(1)
        count = taken.sum(dim=1)
        ends = torch.cumsum(count, 0)
        flat = torch.nonzero(taken.reshape(-1)).squeeze(1)
        return cls(flat, ends - count, ends - 1, lengths, word_mask.shape[1])


def eager_indices(seeds: torch.Tensor, seed_mask: torch.Tensor, word_mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """What the fused proposal indexes by: the real seeds and their spans (`real_seeds`), and the
    words' rows' flat positions, firsts, lasts and lengths (`WordRows`). Worked out where the feeds
    are: on the host, from the arrays a served pass's feeds were uploaded from, and sent up in one
    copy, so that a pass on a GPU does not wait for the device to count its seeds and words; on the
    device where the feeds did not come from the host (the module called directly, or traced whole,
    which must record operators rather than the host's answers as constants)."""
    seeds_on_host, seed_mask_on_host, word_mask_on_host = map(host_array_of, (seeds, seed_mask, word_mask))
    if seeds_on_host is None or seed_mask_on_host is None or word_mask_on_host is None:
        rows = WordRows.of(word_mask)
        return (*real_seeds(seeds, seed_mask), rows.flat, rows.first, rows.last, rows.lengths)
    real = seed_mask_on_host > 0
    lengths = word_mask_on_host.sum(axis=1).astype(np.int64)
    taken = np.arange(word_mask_on_host.shape[1])[None, :] <= lengths[:, None]
    count = taken.sum(axis=1)
    ends = np.cumsum(count)
    arrays = [np.argwhere(real), seeds_on_host[real], np.flatnonzero(taken), ends - count, ends - 1, lengths]
    return tuple(to_tensors(arrays, seed_mask.device))


@dataclass(frozen=True)
class SpanReads:
    """Spans' rows [M] each: their first and last words' among the words' rows (`WordRows`), their
    max-pool's two in the range-max table by row, and (where asked) the words just outside them."""

    first_word: torch.Tensor
    last_word: torch.Tensor
    pool_first: torch.Tensor
    pool_second: torch.Tensor
    before: torch.Tensor | None = None
    after: torch.Tensor | None = None


def first_layer(
    reads: SpanReads,
    pools: torch.Tensor,
    lefts: tuple[torch.Tensor, ...],
    rights: tuple[torch.Tensor, ...],
    contexts: torch.Tensor,
) -> torch.Tensor:
    """Scorers' first layer for spans (the filter's and the regressor's side by side, or the
    classifier's), from the words' rows of the fused per-word parts: max-pool, left and right
    boundary words (a second scorer's are those just outside the span), then the sentence's part,
    summed in SpanScorer's order."""
    pooled = torch.maximum(pools.index_select(0, reads.pool_first), pools.index_select(0, reads.pool_second))
    left = _side_by_side(lefts, (reads.first_word, reads.before))
    right = _side_by_side(rights, (reads.last_word, reads.after))
    return pooled + left + right + contexts


def _side_by_side(parts: tuple[torch.Tensor, ...], rows: tuple[torch.Tensor | None, ...]) -> torch.Tensor:
    """Each part's rows (the first part's at rows[0], a second's at rows[1]), side by side."""
    read = []
    for part, at in zip(parts, rows[: len(parts)], strict=True):
        assert at is not None, "a second scorer's words just outside the span: span_reads(outside=True)"
        read.append(part.index_select(0, at))
    return read[0] if len(read) == 1 else torch.cat(read, dim=1)
