"""Which queued items form the next batch: a pure function, tested without clocks or threads."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Protocol, TypeVar


@dataclass(frozen=True)
class BatchLimits:
    max_batch_size: int = 32  # sentences
    max_batch_tokens: int = 8192  # padded cost: longest sentence (sub-words) × sentences
    max_wait_ms: float = 5.0  # a batch closes this long after its oldest item arrived
    max_queue: int = 2048  # sentences waiting; beyond it requests are refused (429)
    lookahead: int = 4  # packing looks at max_batch_size × lookahead oldest items
    max_padding: float = 1.0  # largest share of a batch's padded cost that may be padding
    # admission: a request whose sentences would wait longer than this (queued sentences ÷ the
    # measured rate) is refused at once with 429, so accepted ones keep their latency
    max_queue_seconds: float = 1.0
    # most sentences of one request in a batch (None: no limit); see Settings.request_share_bound
    max_request_share: int | None = None


class Sized(Protocol):
    cost: int
    request: int  # which request the item belongs to


def padded_cost(costs: list[int]) -> int:
    return max(costs, default=0) * len(costs)


T = TypeVar("T", bound=Sized)


def select_batch(queue: list[T], limits: BatchLimits) -> list[int]:
    """Indices (into `queue`, oldest first) of the next batch.

    The oldest item always goes (FIFO fairness; alone if it is over the token budget by itself).
    The rest are chosen among the next max_batch_size × lookahead items by closeness of length to
    it, so a batch holds sentences of similar length and padding stays low, while the token
    budget bounds the padded cost, and max_request_share what one request may take of it.
    """
    if not queue:
        return []
    window = queue[: limits.max_batch_size * limits.lookahead]
    anchor = window[0].cost
    others = sorted(range(1, len(window)), key=lambda i: (abs(window[i].cost - anchor), i))
    chosen = [0]
    longest, total = anchor, anchor
    share = limits.max_request_share or limits.max_batch_size
    taken = Counter([window[0].request])
    for i in others:
        if len(chosen) >= limits.max_batch_size:
            break
        if taken[window[i].request] >= share:
            continue
        candidate_longest = max(longest, window[i].cost)
        padded = candidate_longest * (len(chosen) + 1)
        if padded > limits.max_batch_tokens or 1 - (total + window[i].cost) / padded > limits.max_padding:
            continue
        chosen.append(i)
        taken[window[i].request] += 1
        longest, total = candidate_longest, total + window[i].cost
    return sorted(chosen)
