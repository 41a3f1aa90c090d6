"""ONNX Runtime session settings chosen by measurement at export, recorded in export.json.

Each exported graph is timed under every graph optimisation level ONNX Runtime has, on one
intra-op thread, and the service opens the graph at the fastest (`runtime.onnx.OPTIMIZATION_LEVELS`).
A level wins only by more than the timing noise; otherwise "all" stays, the level ONNX Runtime's
own fusions are tested at. The chosen level is also timed on every core, so that export.json shows
what more intra-op threads buy a graph on the machine that exported it (the thread count itself
is the operator's: `nerserve serve --threads`, cores per replica); not in a start-up export behind
a serving model, where the other cores are busy and that figure would be the load's.
"""

from __future__ import annotations

import os
import time
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from nerserve.ner.runtime.onnx import DEFAULT_OPTIMIZATION_LEVEL, OPTIMIZATION_LEVELS, OnnxGraph

REPEATS = 9
# a level must beat "all" by more than this share of its time: what is left of run-to-run noise
NOISE = 0.05


def best_milliseconds(graphs: Mapping[str, OnnxGraph], feeds: Mapping[str, np.ndarray]) -> dict[str, float]:
    """Each graph's fastest of REPEATS runs, the graphs taking turns run by run. Load from elsewhere
    on the machine (a first start exports two models at once) only ever adds time, so the fastest
    run is the graph's own cost, where a median taken while other exports run can pick a level
    for the noise."""
    for graph in graphs.values():
        graph.run(feeds)  # first run: allocations and kernel selection
    times: dict[str, list[float]] = {name: [] for name in graphs}
    for _ in range(REPEATS):
        for name, graph in graphs.items():
            started = time.perf_counter()
            graph.run(feeds)
            times[name].append(time.perf_counter() - started)
    return {name: round(1000 * min(runs), 3) for name, runs in times.items()}


def tune_graph(path: Path, feeds: Mapping[str, np.ndarray], every_core: bool = True) -> dict[str, Any]:
    """The fastest optimisation level for one graph, with every level's best ms and the chosen
    level's best ms on 1 thread and (`every_core`) on every core."""
    timings = best_milliseconds(
        {level: OnnxGraph(path, threads=1, optimization_level=level) for level in OPTIMIZATION_LEVELS}, feeds
    )
    fastest = min(timings, key=lambda level: timings[level])
    chosen = fastest if timings[fastest] < (1 - NOISE) * timings[DEFAULT_OPTIMIZATION_LEVEL] else DEFAULT_OPTIMIZATION_LEVEL
    cores = os.cpu_count() or 1
    threads_ms = {"1": timings[chosen]}
    if every_core and cores > 1:
        graph = OnnxGraph(path, threads=cores, optimization_level=chosen)
        threads_ms[str(cores)] = best_milliseconds({"cores": graph}, feeds)["cores"]
    return {"graph_optimization_level": chosen, "level_ms": timings, "threads_ms": threads_ms}


def tune_graphs(
    paths: Mapping[str, Path], feeds: Mapping[str, Mapping[str, np.ndarray]], every_core: bool = True
) -> dict[str, Any]:
    """`tune_graph` for every graph of a set, each on its own inputs from the export's example batch."""
    return {name: tune_graph(path, feeds[name], every_core) for name, path in paths.items()}


# the caps a set that misses parity at its fastest levels is tried at, in turn: fewer fusions each
LOWER_CAPS = tuple(reversed(list(OPTIMIZATION_LEVELS)[:-1]))


def capped_levels(onnx_session: Mapping[str, Any], cap: str, graphs: Collection[str] | None = None) -> dict[str, Any] | None:
    """The tuned settings with each of `graphs` (all when None) opened at most at `cap` (the levels
    are ordered: each adds fusions to the one before, and a fusion may reorder floating-point sums),
    or None when no graph's level changes."""
    order = list(OPTIMIZATION_LEVELS)
    limit = order.index(cap)
    capped = {
        name: {**tuned, "graph_optimization_level": order[min(order.index(tuned["graph_optimization_level"]), limit)]}
        if graphs is None or name in graphs
        else dict(tuned)
        for name, tuned in onnx_session.items()
    }
    changed = any(capped[name] != onnx_session[name] for name in onnx_session)
    return capped if changed else None


def lower_level_candidates(onnx_session: Mapping[str, Any], missed: Collection[str]) -> list[tuple[str, dict[str, Any]]]:
    """The settings a set that missed parity at its tuned levels is re-checked at, in order, each
    once: at every cap in LOWER_CAPS, first only the `missed` graphs (those whose own outputs were
    out of tolerance) lowered, then every graph. Lowering only the graph that missed keeps the
    others' fused kernels: gner-open's decoder step, run ~5 times a word, is 2-4.5% faster at "all"
    than at "basic" (two exports' timings), while its encoder was the graph off by 1.02e-4.
    Returns (what was lowered, settings) pairs."""
    some = sorted(set(missed) & set(onnx_session))
    scopes: list[list[str] | None] = [some, None] if 0 < len(some) < len(onnx_session) else [None]
    candidates: list[tuple[str, dict[str, Any]]] = []
    for cap in LOWER_CAPS:
        for graphs in scopes:
            levels = capped_levels(onnx_session, cap, graphs)
            if levels is not None and all(levels != seen for _, seen in candidates):
                lowered = "every graph" if graphs is None else ", ".join(graphs)
                candidates.append((f"{lowered} at most at {cap!r}", levels))
    return candidates
