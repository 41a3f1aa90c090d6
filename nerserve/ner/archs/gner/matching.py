"""GNER's hierarchical matching of generated words onto the input words (standard library only).

A model that writes every word back may drop, add or alter words. The paper aligns its output in
three tiers, cheapest first: identical word lists map position by position; a generated list
that is an in-order subsequence of the input (omissions only) maps greedily; anything else goes
through the longest common subsequence, computed by Hunt–Szymanski in O((n + r) log n) for r
matching pairs instead of the O(n·m) table (kept here as `lcs_table` for the paper's Table 5).
"""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict
from collections.abc import Sequence
from typing import Literal

Tier = Literal["identical", "subsequence", "lcs"]


def greedy_subsequence(words: Sequence[str], generated: Sequence[str]) -> list[int] | None:
    """For each generated word its input position, matching left to right; None if `generated`
    is not an in-order subsequence of `words`."""
    positions, cursor = [], 0
    for word in generated:
        while cursor < len(words) and words[cursor] != word:
            cursor += 1
        if cursor == len(words):
            return None
        positions.append(cursor)
        cursor += 1
    return positions


def lcs_hunt_szymanski(words: Sequence[str], generated: Sequence[str]) -> list[tuple[int, int]]:
    """(input position, generated position) pairs of one longest common subsequence.

    For each generated word, in order, its occurrences in the input are visited right to left;
    `thresholds[k]` is the smallest input position that ends a common subsequence of length k + 1
    so far, updated by binary search (patience sorting), with a back-pointer chain per entry."""
    occurrences: dict[str, list[int]] = defaultdict(list)
    for position, word in enumerate(words):
        occurrences[word].append(position)
    thresholds: list[int] = []
    links: list[tuple[int, int, int] | None] = []  # per threshold: (input pos, generated pos, index of predecessor link)
    chain: list[tuple[int, int, int]] = []  # every link made: (input pos, generated pos, predecessor or -1)
    for g, word in enumerate(generated):
        for position in reversed(occurrences.get(word, ())):
            k = bisect_left(thresholds, position)
            predecessor = links[k - 1][2] if k > 0 and links[k - 1] is not None else -1  # type: ignore[index]
            chain.append((position, g, predecessor))
            entry = (position, g, len(chain) - 1)
            if k == len(thresholds):
                thresholds.append(position)
                links.append(entry)
            else:
                thresholds[k] = position
                links[k] = entry
    if not thresholds:
        return []
    pairs = []
    index = links[-1][2]  # type: ignore[index]
    while index >= 0:
        position, g, index = chain[index]
        pairs.append((position, g))
    return pairs[::-1]


def lcs_table(words: Sequence[str], generated: Sequence[str]) -> list[tuple[int, int]]:
    """The same alignment by the O(n·m) dynamic programme (the baseline of the paper's Table 5)."""
    n, m = len(words), len(generated)
    table = [[0] * (m + 1) for _ in range(n + 1)]
    for i in range(n - 1, -1, -1):
        for j in range(m - 1, -1, -1):
            table[i][j] = table[i + 1][j + 1] + 1 if words[i] == generated[j] else max(table[i + 1][j], table[i][j + 1])
    pairs, i, j = [], 0, 0
    while i < n and j < m:
        if words[i] == generated[j]:
            pairs.append((i, j))
            i, j = i + 1, j + 1
        elif table[i + 1][j] >= table[i][j + 1]:
            i += 1
        else:
            j += 1
    return pairs


def align(words: Sequence[str], generated: Sequence[str], use_lcs: bool = True) -> tuple[dict[int, int], Tier]:
    """Input position → generated position for every matched input word, and the tier that
    matched. Without LCS (an ablation of Table 6), a list that is neither identical nor a
    subsequence is read position by position as far as the words agree."""
    if list(words) == list(generated):
        return {i: i for i in range(len(words))}, "identical"
    greedy = greedy_subsequence(words, generated)
    if greedy is not None:
        return {position: g for g, position in enumerate(greedy)}, "subsequence"
    if not use_lcs:
        return {i: i for i in range(min(len(words), len(generated))) if words[i] == generated[i]}, "lcs"
    return dict(lcs_hunt_szymanski(words, generated)), "lcs"
