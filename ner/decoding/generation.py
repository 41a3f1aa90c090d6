"""The step loop of a decoder graph with a key/value cache (numpy; the graphs do the arithmetic).

The loop, the choice of the next token and the stopping rule stay in the program, outside the
graphs: one step graph then serves every length, beam width and stopping rule without re-export,
and the cache passes from step to step as the runtime's own device values (ner.graph).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from ner.graph import Graph, KeyValueCache, Value

# (step index, logits [rows, V]) → logits with forbidden tokens set to -inf (constrained decoding)
Constraint = Callable[[int, np.ndarray], np.ndarray]


@dataclass(frozen=True)
class StepNames:
    """How a step graph names the token it reads and the scores it writes."""

    token: str = "tokens"  # [rows] int64: the previous token of each row
    position: str = "positions"  # [rows] int64: its position (the cache length before this step)
    logits: str = "logits"  # [rows, V] float32: scores of the next token


@dataclass(frozen=True)
class Generated:
    tokens: np.ndarray  # [rows, steps] int64; after a row's end token: the end token again
    logits: np.ndarray  # [rows, steps, V] float32, each step's scores as the graph wrote them
    finished: np.ndarray  # [rows] bool: the row wrote its end token within max_steps


def greedy(
    step: Graph,
    fixed: Mapping[str, Value],
    first: np.ndarray,
    cache: KeyValueCache,
    max_steps: int,
    end: int,
    names: StepNames = StepNames(),
    constraint: Constraint | None = None,
) -> Generated:
    """Greedy decoding from `first` ([rows] start tokens): one step-graph call per position,
    stopping when every row has written `end` or after `max_steps` tokens."""
    rows = len(first)
    past: dict[str, Value] = dict(cache.empty(rows))
    token = first.astype(np.int64)
    finished = np.zeros(rows, dtype=bool)
    tokens: list[np.ndarray] = []
    scores: list[np.ndarray] = []
    for index in range(max_steps):
        feeds = {**fixed, **past, names.token: token, names.position: np.full(rows, index, dtype=np.int64)}
        outputs = step.run(feeds, keep_on_device=cache.present)
        logits = np.asarray(outputs[names.logits], dtype=np.float32)
        chosen = (constraint(index, logits) if constraint else logits).argmax(axis=-1).astype(np.int64)
        token = np.where(finished, end, chosen)
        tokens.append(token)
        scores.append(logits)
        finished |= token == end
        past = cache.carry(outputs)
        if finished.all():
            break
    return Generated(np.stack(tokens, axis=1), np.stack(scores, axis=1), finished)
