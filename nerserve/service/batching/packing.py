"""Which queued items form the next batch: a pure function, tested without clocks or threads.

The encoders pack a batch's sentences into rows (ner.text.subword) instead of padding each to the
longest, so a batch costs about the sum of its sentences' sub-words whatever their lengths: items
are taken oldest first, with no need to group similar lengths.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Protocol, TypeVar


@dataclass(frozen=True)
class BatchLimits:
    max_batch_size: int = 32  # sentences
    max_batch_tokens: int = 8192  # sub-words of a batch's sentences, specials included
    max_wait_ms: float = 5.0  # a batch closes this long after its oldest item arrived
    max_queue: int = 2048  # sentences waiting; beyond it requests are refused (429)
    lookahead: int = 4  # a batch is chosen among the max_batch_size × lookahead oldest items
    # admission: a request whose wait on others' work (in fair order, at the measured sub-words/s)
    # would exceed this is refused at once with 429, so admitted ones keep their latency
    max_queue_seconds: float = 1.0
    # most sub-words of one request in a batch (None: no limit; the batch's first item goes whatever
    # its size); see Settings.request_tokens_bound
    max_request_tokens: int | None = None
    # close a batch at once when nothing is prepared or running: waiting for company would only
    # delay a lone request (the service sets it on every device; off, a batch gathers for max_wait)
    close_when_idle: bool = False
    # while a batch runs and nothing waits prepared, let the next one grow until the running one is
    # about to end, less the time to prepare it (see Settings.close_as_device_frees)
    close_as_device_frees: bool = False


class Sized(Protocol):
    cost: int
    request: int  # which request the item belongs to


T = TypeVar("T", bound=Sized)


def select_batch(queue: list[T], limits: BatchLimits) -> list[int]:
    """Indices (into `queue`, oldest first) of the next batch.

    In queue order (the scheduler's fair order): the first item always goes (alone if it is over
    the token budget by itself), then every later one among the next max_batch_size × lookahead
    that fits the token budget and its request's share (max_request_tokens), so that a large
    request, or a long window, does not make a batch long that it does not head, while the
    look-ahead lets other requests' sentences past it.
    """
    if not queue:
        return []
    window = queue[: limits.max_batch_size * limits.lookahead]
    share = limits.max_request_tokens
    chosen = [0]
    total = window[0].cost
    taken = Counter({window[0].request: window[0].cost})
    for i in range(1, len(window)):
        if len(chosen) >= limits.max_batch_size:
            break
        item = window[i]
        over_share = share is not None and taken[item.request] + item.cost > share
        if over_share or total + item.cost > limits.max_batch_tokens:
            continue
        chosen.append(i)
        taken[item.request] += item.cost
        total += item.cost
    return chosen
