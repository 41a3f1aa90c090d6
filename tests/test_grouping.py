"""A per-sentence graph run on groups of similar sizes gives the whole batch's outputs inside every
row's own sizes; a CPU batch's length groups are the cheapest cut of its sentences by word count
(ner.archs.grouping)."""

from __future__ import annotations

import itertools
from collections.abc import Collection, Mapping, Sequence

import numpy as np

from nerserve.ner.archs.grouping import in_batch_order, length_groups, run_grouped, size_groups
from nerserve.ner.graph import GraphSignature

SIGNATURE = GraphSignature(
    ("word_states", "word_mask", "seeds", "seed_mask"),
    ("score", "width"),
    {
        "word_states": ("batch", "words", ""),
        "word_mask": ("batch", "words"),
        "seeds": ("batch", "spans", ""),
        "seed_mask": ("batch", "spans"),
        "score": ("batch", "spans"),
        "width": ("batch", "spans", ""),
    },
)


class RowwiseGraph:
    """Each row's outputs from that row alone, masked: as a real span graph's."""

    input_names = SIGNATURE.inputs
    output_names = SIGNATURE.outputs
    device_resident = False
    execution_provider = "numpy"

    def __init__(self) -> None:
        self.calls: list[tuple[int, ...]] = []

    def run(self, inputs: Mapping[str, np.ndarray], keep_on_device: Collection[str] = ()) -> dict[str, np.ndarray]:
        self.calls.append(inputs["seeds"].shape)
        words = (inputs["word_states"][..., 0] * inputs["word_mask"]).sum(axis=1)
        start, end = inputs["seeds"][..., 0], inputs["seeds"][..., 1]
        score = (words[:, None] + start * 10.0) * inputs["seed_mask"]
        return {"score": score.astype(np.float32), "width": np.stack([end - start, end], axis=-1)}


def feeds_for(word_counts: list[int], rng: np.random.Generator) -> tuple[dict[str, np.ndarray], list[int]]:
    seeds_of = [[(i, i + w) for w in (1, 2) for i in range(n - w + 1)] for n in word_counts]
    words, spans = max(word_counts), max(len(s) for s in seeds_of)
    feeds = {
        "word_states": rng.normal(size=(len(word_counts), words, 4)).astype(np.float32),
        "word_mask": np.zeros((len(word_counts), words), dtype=np.float32),
        "seeds": np.zeros((len(word_counts), spans, 2), dtype=np.int64),
        "seed_mask": np.zeros((len(word_counts), spans), dtype=np.float32),
    }
    for b, (n, seeds) in enumerate(zip(word_counts, seeds_of, strict=True)):
        feeds["word_mask"][b, :n] = 1.0
        feeds["seeds"][b, : len(seeds)] = seeds
        feeds["seed_mask"][b, : len(seeds)] = 1.0
    return feeds, [len(s) for s in seeds_of]


def test_groups_cover_every_row_once_and_bound_the_padding() -> None:
    sizes = [3, 40, 7, 39, 12, 1, 38, 8, 2, 11]
    groups = size_groups(sizes, slack=1.25)
    assert sorted(np.concatenate(groups).tolist()) == list(range(len(sizes)))
    for rows in groups:
        members = [sizes[r] for r in rows]
        assert len(members) * max(members) <= 1.25 * sum(members) or len(members) == 1
    assert len(size_groups([5, 5, 5])) == 1


def test_an_allowance_of_padding_keeps_small_rows_in_one_group() -> None:
    sizes = [3, 40, 7, 39, 12, 1, 38, 8, 2, 11]
    groups = size_groups(sizes, slack=1.25, allowance=30)
    assert [sorted(sizes[r] for r in rows) for rows in groups] == [[12, 38, 39, 40], [2, 3, 7, 8, 11], [1]]
    assert len(size_groups(sizes, slack=1.25)) == 5
    for rows in groups:
        members = [sizes[r] for r in rows]
        assert len(members) * max(members) <= max(1.25 * sum(members), sum(members) + 30)


def test_grouped_outputs_equal_the_whole_batch_inside_each_row() -> None:
    rng = np.random.default_rng(0)
    word_counts = [3, 40, 7, 39, 12, 1, 38, 8, 2, 11]
    feeds, seed_counts = feeds_for(word_counts, rng)
    whole = RowwiseGraph().run(feeds)
    graph = RowwiseGraph()
    sizes = {"words": word_counts, "spans": seed_counts}
    grouped = run_grouped(graph, feeds, SIGNATURE, sizes, size_groups(seed_counts))
    assert len(graph.calls) > 1 and all(calls[1] < feeds["seeds"].shape[1] for calls in graph.calls[1:])
    for name in SIGNATURE.outputs:
        assert grouped[name].shape == whole[name].shape and grouped[name].dtype == whole[name].dtype
        for b, count in enumerate(seed_counts):
            np.testing.assert_allclose(grouped[name][b, :count], whole[name][b, :count], rtol=1e-6)
            assert not grouped[name][b, count:].any()


def groups_cost(word_counts: Sequence[int], groups: Sequence[np.ndarray], pass_cost: int) -> int:
    return sum(pass_cost + len(rows) * max(word_counts[r] for r in rows) for rows in groups)


def cheapest_cut(word_counts: Sequence[int], pass_cost: int) -> int:
    """Every way to cut the sentences sorted by word count, tried."""
    ordered = sorted(word_counts)
    best = None
    for cuts in itertools.product((False, True), repeat=len(ordered) - 1):
        cost, first = 0, 0
        for end, cut in enumerate([*cuts, True], start=1):
            if cut:
                cost += pass_cost + (end - first) * ordered[end - 1]
                first = end
        best = cost if best is None else min(best, cost)
    assert best is not None
    return best


def test_length_groups_are_the_cheapest_cut_of_the_sentences_by_word_count() -> None:
    rng = np.random.default_rng(3)
    for _ in range(40):
        word_counts = rng.integers(1, 60, size=int(rng.integers(2, 11))).tolist()
        pass_cost = int(rng.choice([0, 20, 200]))
        groups = length_groups(word_counts, pass_cost)
        assert sorted(np.concatenate(groups).tolist()) == list(range(len(word_counts)))
        assert all((np.diff(rows) > 0).all() for rows in groups)  # batch order within a group
        assert groups_cost(word_counts, groups, pass_cost) == cheapest_cut(word_counts, pass_cost)


def test_a_mixed_batch_is_cut_in_two_and_an_even_one_runs_whole() -> None:
    mixed = [5, 40, 6, 38, 4, 41, 7, 39] * 4  # a batch of 32 in arrival order
    groups = length_groups(mixed)
    assert [sorted({mixed[r] for r in rows}) for rows in groups] == [[4, 5, 6, 7], [38, 39, 40, 41]]
    assert len(length_groups([12, 14, 13, 15] * 8)) == 1
    assert len(length_groups([5, 40])) == 1  # two sentences: another pass costs more than it saves
    assert [rows.tolist() for rows in length_groups([])] == [[]]


def test_results_come_back_in_the_batch_order() -> None:
    groups = [np.array([1, 3]), np.array([0, 2, 4])]
    assert in_batch_order(groups, [["b", "d"], ["a", "c", "e"]]) == ["a", "b", "c", "d", "e"]
