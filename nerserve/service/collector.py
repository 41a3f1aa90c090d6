"""The cycle collector, set for a server that answers thousands of requests a second.

A request in flight holds a dozen tracked objects (its work items, answer slots, run, closures)
and frees them by reference counting once answered: the request path makes no cycle. The
collector's default young threshold, a pass every 700 net allocations, is crossed by every wave of
a few hundred requests in flight: each pass found them alive, moved them to the older
generations, and so brought on full passes too, which walk everything the process has made (a
closed loop at c = 256 on the simulated device: 2,750 young, 249 middle and 21 full passes in
24 s, about 1 s of the event loop's time, the full ones 10-35 ms pauses). A threshold above what
a full engine holds in flight leaves passes for real garbage: 20 young passes and none older in
the same run. What loading made lives as long as the process and is frozen out of every pass.
"""

from __future__ import annotations

import gc

# net tracked allocations between young passes: above the objects of a few thousand requests in flight
YOUNG_THRESHOLD = 10_000


def settle_collector() -> None:
    """Freeze what exists now (start-up: graphs, tokenizers, configs) and collect young objects
    only when more than YOUNG_THRESHOLD have accumulated. Called once start-up is done, again as
    each model loads."""
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
