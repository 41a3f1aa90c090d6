"""The interpreter, set for a server that answers thousands of requests a second: its cycle
collector, and how soon a thread waiting for the interpreter lock gets it
(docs/decisions/gpu-engine.md, "One estimate, answer slots, a quieter collector" and "A lane takes
its next batch itself").

A request in flight holds a dozen tracked objects (work items, answer slots, its run, closures)
that reference counting frees once it is answered: the request path makes no cycle. At the
collector's default young threshold (700 net allocations) every wave of a few hundred requests in
flight set off a young pass that found them alive and moved them on, which brought on full
passes, each a pause of the event loop. A threshold above what a full engine holds in flight
leaves passes for real garbage. What start-up made lives as long as the process and is frozen out
of every pass.
"""

from __future__ import annotations

import gc
import sys

# net tracked allocations between young passes: above the objects of a few thousand requests in flight
YOUNG_THRESHOLD = 10_000

# How soon a thread waiting for the interpreter lock asks for it (serve's --interpreter-switch-ms).
# The event loop shares the lock with the prepare, graph and decode threads: at Python's default
# 5 ms a refusal or a finished response waited that long per hand-off under load, and a graph
# thread whose pass had ended waited as long to start the next (on a device, as long as a pass).
# 0.5 ms measured no better on the simulated device, whose stand-in passes release the lock once;
# an eager pass releases it at every operator (docs/decisions/gpu-engine.md, "A pass that releases
# the interpreter lock at every operator").
DEFAULT_SWITCH_MS = 1.0


def settle_collector() -> None:
    """Freeze what exists now (start-up: graphs, tokenizers, configs) and collect young objects
    only when more than YOUNG_THRESHOLD have accumulated. Called once start-up is done, again as
    each model loads."""
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)


def hand_over_quickly(switch_ms: float = DEFAULT_SWITCH_MS) -> None:
    """Every process of the server, and the benchmarks that stand for one: a thread waiting for the
    interpreter lock asks for it after SWITCH_MS."""
    sys.setswitchinterval(switch_ms / 1000)
