"""Graphs run on groups of sentences of similar sizes instead of the whole batch.

A graph whose rows are independent (one sentence each) but padded to the batch's largest on some
axis (seed spans, words) spends its time on padding when a batch mixes lengths, as a server's
batches do (sentences in arrival order): a few long rows make every row as long. Grouping rows
by size before the call and padding the outputs back keeps the padding bounded whatever the batch;
positions past a row's own size come back as zeros (every reader masks them).

On the CPU a whole batch can run in groups too (`length_groups`): every architecture's word-level
BiLSTM, and its decoder or span tables, run over word positions padded to the batch's longest
sentence, so a batch in arrival order is cut where the padding saved costs more than one more pass.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeVar

import numpy as np

from nerserve.ner.graph import Graph, GraphSignature

T = TypeVar("T")

# A group takes the next (smaller) row while its positions padded to its largest row stay within
# this share of its real positions; another graph call costs far less than 25 % padding.
PADDING_SLACK = 1.25

# What one more pass of a batch's graphs costs on the CPU, in padded word positions: ONNX Runtime's
# own work a call over the graphs' ~1,200 nodes (about 4 ms for span-conll03 on one core) against
# some 20–40 µs a padded word position (BiLSTM, span tables, decoder). Of 100, 200 and 400, 200
# measured best (docs/decisions/cpu-inference.md, "A batch in length groups").
PASS_COST_WORDS = 200


def length_groups(word_counts: Sequence[int], pass_cost: int = PASS_COST_WORDS) -> list[np.ndarray]:
    """A batch's sentences (indices, in batch order within a group) in the groups of similar word
    counts that cost least: each group a pass of `pass_cost` word positions plus its sentences
    times its longest. Groups are runs of the sentences sorted by word count, chosen exactly: the
    least cost of each sorted prefix from the prefixes before it, ending only where the count
    changes (a cut inside sentences of one count never costs less than at their end)."""
    order = sorted(range(len(word_counts)), key=word_counts.__getitem__)
    counts = [word_counts[i] for i in order]
    ends = [end for end in range(1, len(counts) + 1) if end == len(counts) or counts[end - 1] != counts[end]]
    least = {0: 0}
    start_of: dict[int, int] = {}
    for end in ends:
        longest = counts[end - 1]
        best, best_first = least[0] + end * longest, 0
        for first, cost_before in least.items():
            cost = cost_before + (end - first) * longest
            if cost < best:
                best, best_first = cost, first
        least[end], start_of[end] = best + pass_cost, best_first
    groups: list[np.ndarray] = []
    end = len(counts)
    while end:
        first = start_of[end]
        groups.append(np.sort(np.array(order[first:end], dtype=np.int64)))
        end = first
    return groups[::-1] or [np.arange(0, dtype=np.int64)]


def in_batch_order(groups: Sequence[np.ndarray], results: Sequence[Sequence[T]]) -> list[T]:
    """Each group's results (in its rows' order) back in the batch's order."""
    ordered: list[T | None] = [None] * sum(len(rows) for rows in groups)
    for rows, found in zip(groups, results, strict=True):
        for row, item in zip(rows.tolist(), found, strict=True):
            ordered[row] = item
    return ordered  # type: ignore[return-value]  # every row is in exactly one group


def size_groups(sizes: Sequence[int], slack: float = PADDING_SLACK, allowance: int = 0) -> list[np.ndarray]:
    """Row indices in groups, largest rows first: each group padded to its first row's size has at
    most `slack` × its rows' own sizes, or at most `allowance` positions of padding."""
    order = np.argsort(-np.asarray(sizes, dtype=np.int64), kind="stable")
    groups: list[list[int]] = []
    real = 0
    for row in order.tolist():
        size = max(1, int(sizes[row]))
        padded = (len(groups[-1]) + 1) * max(1, int(sizes[groups[-1][0]])) if groups else 0
        if groups and padded <= max(slack * (real + size), real + size + allowance):
            groups[-1].append(row)
            real += size
        else:
            groups.append([row])
            real = size
    return [np.array(sorted(g), dtype=np.int64) for g in groups]


def groups_for(graph: Graph, sizes: Sequence[int], allowance: int = 0) -> list[np.ndarray]:
    """size_groups on the CPU; one group of every row where the graph keeps its outputs on its
    device: a GPU pays less for padding than for another call."""
    if graph.device_resident:
        return [np.arange(len(sizes), dtype=np.int64)]
    return size_groups(sizes, allowance=allowance)


def run_grouped(
    graph: Graph,
    feeds: Mapping[str, np.ndarray],
    signature: GraphSignature,
    sizes: Mapping[str, Sequence[int]],
    groups: Sequence[np.ndarray],
) -> dict[str, np.ndarray]:
    """`graph` on `feeds` (every input and output with the "batch" axis first), called once per
    group of rows (size_groups: a caller that runs the graph again on the same rows groups them
    once); `sizes` gives each row's own length on every ragged axis, to which each group's feeds
    are cut. Outputs as the whole batch's call would shape them, zeros past a row's own sizes."""
    if len(groups) == 1:
        return graph.run(feeds)
    widths = {axis: np.asarray(rows, dtype=np.int64) for axis, rows in sizes.items()}
    batch = sum(len(rows) for rows in groups)
    outputs: dict[str, np.ndarray] = {}
    for rows in groups:
        part = graph.run(group_feeds(feeds, signature, widths, rows))
        for name, value in part.items():
            if name not in outputs:
                axes = zip(signature.axes[name][1:], value.shape[1:], strict=True)
                ragged = (int(widths[axis].max()) if axis in widths else size for axis, size in axes)
                outputs[name] = np.zeros((batch, *ragged), dtype=value.dtype)
            within: tuple[np.ndarray | slice, ...] = (rows, *(slice(0, size) for size in value.shape[1:]))
            outputs[name][within] = value
    return outputs


def group_feeds(
    feeds: Mapping[str, np.ndarray], signature: GraphSignature, widths: Mapping[str, np.ndarray], rows: np.ndarray
) -> dict[str, np.ndarray]:
    """The feeds of a group of ROWS, each ragged axis cut to the group's largest row (WIDTHS: every
    row's own length on each ragged axis)."""
    cut = {axis: int(width[rows].max()) for axis, width in widths.items()}
    return {name: _take(value, rows, signature.axes[name], cut) for name, value in feeds.items()}


def _take(value: np.ndarray, rows: np.ndarray, axes: tuple[str, ...], cut: Mapping[str, int]) -> np.ndarray:
    """The group's rows cut to its sizes, in one copy (contiguous, as a graph wants its inputs)."""
    trimmed = (slice(0, cut[axis]) if axis in cut else slice(None) for axis in axes[1:])
    return value[(rows, *trimmed)]
