"""The step loop of a decoder graph with a key/value cache (numpy; the graphs do the arithmetic).

The loop, the choice of the next token and the stopping rule stay in the program, outside the
graphs: one step graph then serves every length, beam width and stopping rule without re-export,
and the cache passes from step to step as the runtime's own device values (ner.graph). Beam
search reorders the cache on the device: a step graph that takes `cache_order` does it itself,
and a loop whose step graph does not has a `reorder` of its own (a graph that gathers rows).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Protocol, runtime_checkable

import numpy as np

from nerserve.ner.graph import Graph, KeyValueCache, Value

# (logits [rows, V], tokens so far [rows, t] incl. the first) → logits with forbidden tokens at
# -inf: the grammar of the sequences (constrained decoding)
Constraint = Callable[[np.ndarray, np.ndarray], np.ndarray]


@runtime_checkable
class Candidates(Protocol):
    """A constraint that names, before a step, the tokens each row may write: a step graph that
    takes a `vocabulary` then scores only their union (a decoder's projection onto a large
    vocabulary reads every row of its matrix at every step: on the CPU, half a step's time)."""

    def candidates(self, history: np.ndarray) -> list[list[int]]: ...


@runtime_checkable
class PerRow(Protocol):
    """A constraint whose rules are each row's own (lengths, limits): `select(rows)` is the
    constraint of those rows alone, so that a loop may stop running rows that have finished."""

    def select(self, rows: np.ndarray) -> Constraint | Candidates: ...


# (order [rows], cache) → the cache's rows in that order, where the cache is
Reorder = Callable[[np.ndarray, Mapping[str, Value]], dict[str, Value]]
BLOCKED = -1e9


@dataclass(frozen=True)
class StepNames:
    """How a step graph names its per-step inputs and its scores."""

    token: str = "tokens"  # [rows] int64: the previous token of each row
    position: str = "positions"  # [rows] int64: that token's position
    cache_order: str = "cache_order"  # [rows] int64: whose cache each row continues (if an input)
    vocabulary: str = "vocabulary"  # [A] int64: the tokens the step scores (if an input)
    logits: str = "logits"  # [rows, V] (or [rows, A]) float32: scores of the next token
    states: str = "states"  # [rows, D]: the decoder's output states (an output of some step graphs)


@dataclass(frozen=True)
class Generated:
    tokens: np.ndarray  # [rows, steps] int64; after a row's end token: the end token again
    # [rows, steps] float64: each chosen token's log-probability, after the constraint (0 after the
    # end token where the row has left the loop)
    log_probs: np.ndarray
    finished: np.ndarray  # [rows] bool: the row wrote its end token within max_steps
    # [rows, steps, V] float32: every step's scores (only when asked: a 30k vocabulary makes it GBs)
    logits: np.ndarray | None = None


@dataclass
class Loop:
    """One decoding run's fixed parts: the step graph, inputs shared by all rows, per-row inputs
    (repeated for beams), the cache layout, start tokens and position offsets per row."""

    step: Graph
    shared: Mapping[str, Value]
    per_row: Mapping[str, np.ndarray]
    cache: KeyValueCache
    first: np.ndarray  # [rows] int64
    end: int
    offsets: np.ndarray | None = None  # [rows] int64: position of the first token (default 0)
    names: StepNames = field(default_factory=StepNames)
    constraint: Constraint | Candidates | None = None
    reorder: Reorder | None = None  # beam search's, for a step graph without `cache_order`
    # For a step graph that takes a vocabulary, where the constraint names no candidates: every
    # token's scores [rows, V] from the step's outputs (the step itself then scores only `end`).
    every_token: Callable[[Mapping[str, Value]], np.ndarray] | None = None
    # For a loop whose shared inputs hold a row each (gner's prompts): (rows, shared) → those rows'
    # shared inputs, so that greedy decoding may drop finished rows.
    select_shared: Callable[[np.ndarray, Mapping[str, Value]], dict[str, Value]] | None = None

    def run_step(
        self,
        per_row: Mapping[str, np.ndarray],
        past: Mapping[str, Value],
        history: np.ndarray,
        position: np.ndarray,
        order: np.ndarray,
        spare: int = 0,
    ) -> tuple[StepScores, dict[str, Value]]:
        """The next token's scores for each row after `history`, the constraint applied, and the
        grown cache. `spare`: a step that scores a vocabulary scores the `spare` lowest token ids
        too (blocked where not allowed): beam search, where a row has fewer allowed continuations
        than beams, fills its beams with those, as it does when every token is scored."""
        feeds = {**self.shared, **per_row, **past, self.names.token: history[:, -1], self.names.position: position}
        if self.names.cache_order in self.step.input_names:
            feeds[self.names.cache_order] = order
        candidates = self.constraint.candidates(history) if isinstance(self.constraint, Candidates) else None
        flat = None if candidates is None else np.fromiter(itertools.chain.from_iterable(candidates), dtype=np.int64)
        ids = None
        if self.names.vocabulary in self.step.input_names:
            ids = self._vocabulary(flat, spare)
            feeds[self.names.vocabulary] = ids
        outputs = self.step.run(feeds, keep_on_device=self.cache.present)
        present = self.cache.carry(outputs)
        if candidates is None or flat is None:
            if ids is not None and self.every_token is not None:  # the step scored `end` alone
                logits = np.asarray(self.every_token(outputs), dtype=np.float32)
            else:
                logits = np.asarray(outputs[self.names.logits], dtype=np.float32)
            scores = self.constraint(logits, history) if callable(self.constraint) else logits
            return StepScores(scores, None), present
        logits = np.asarray(outputs[self.names.logits], dtype=np.float32)  # [rows, A] over ids, or every token
        rows = np.repeat(np.arange(len(candidates)), [len(row) for row in candidates])
        columns = flat if ids is None else np.searchsorted(ids, flat)
        scores = np.full(logits.shape, BLOCKED, dtype=np.float32)
        scores[rows, columns] = logits[rows, columns]
        return StepScores(scores, ids), present

    @property
    def narrows(self) -> bool:
        """Whether a loop may run a subset of its rows: a step graph that takes `cache_order` takes
        the rows' cache itself (and a row's other inputs are in `per_row`); one that does not has
        them taken by the loop's `reorder` and its `select_shared` (such a loop keeps what it has
        per row among its shared inputs); and the constraint, if any, has per-row rules it can
        `select`."""
        takes_rows = self.names.cache_order in self.step.input_names or (
            self.reorder is not None and self.select_shared is not None
        )
        return takes_rows and (self.constraint is None or isinstance(self.constraint, PerRow))

    def select(self, rows: np.ndarray) -> Loop:
        """The loop of `rows` alone (indices into this loop's rows)."""
        constraint = self.constraint.select(rows) if isinstance(self.constraint, PerRow) else self.constraint
        return replace(
            self,
            shared=self.shared if self.select_shared is None else self.select_shared(rows, self.shared),
            per_row={name: value[rows] for name, value in self.per_row.items()},
            first=self.first[rows],
            offsets=None if self.offsets is None else self.offsets[rows],
            constraint=constraint,
        )

    def continue_rows(self, kept: np.ndarray, past: Mapping[str, Value]) -> tuple[np.ndarray, dict[str, Value]]:
        """The next step's `cache_order` and cache when its rows continue the `kept` rows of this
        one (some of them, or beam search's reordering): a step graph that takes `cache_order`
        takes them itself, else the loop's `reorder` does."""
        if self.names.cache_order in self.step.input_names:
            return kept, dict(past)
        assert self.reorder is not None  # `narrows`, or beam search's check
        return np.arange(len(kept), dtype=np.int64), self.reorder(kept, past)

    def _vocabulary(self, candidates: np.ndarray | None, spare: int) -> np.ndarray:
        """What a step graph that takes a vocabulary scores: the rows' candidates (and the `spare`
        lowest ids), or `end` alone where every token's scores come from `every_token`."""
        if candidates is not None:
            return np.unique(np.concatenate([candidates, np.arange(spare, dtype=np.int64)]))
        if self.every_token is None:
            raise ValueError("a step graph that takes a vocabulary needs Candidates or the loop's every_token")
        return np.array([self.end], dtype=np.int64)


@dataclass(frozen=True)
class StepScores:
    """A step's scores after the constraint, [rows, A]: column a scores token `ids[a]` (every
    token, column = token id, when ids is None)."""

    scores: np.ndarray
    ids: np.ndarray | None

    def tokens(self, columns: np.ndarray) -> np.ndarray:
        return columns if self.ids is None else self.ids[columns]

    def columns(self, tokens: np.ndarray) -> np.ndarray:
        if self.ids is None:
            return tokens
        return np.minimum(np.searchsorted(self.ids, tokens), len(self.ids) - 1)


def greedy(loop: Loop, max_steps: int, keep_logits: bool = False) -> Generated:
    """Greedy decoding: one step-graph call per position, until every row has written the end
    token or after `max_steps` tokens. `keep_logits` needs scores over every token.

    Where the loop can narrow its rows (`Loop.narrows`), a row that has written the end token
    leaves the step: otherwise the batch's longest sequence sets every row's work (a GPU runs the
    whole batch, a CPU group mixes sequence lengths even where its sentences' lengths are alike)."""
    rows = len(loop.first)
    offsets = loop.offsets if loop.offsets is not None else np.zeros(rows, dtype=np.int64)
    past: dict[str, Value] = dict(loop.cache.empty(rows))
    history = loop.first.astype(np.int64)[:, None]
    finished = np.zeros(rows, dtype=bool)
    live = np.arange(rows, dtype=np.int64)  # the rows the step runs, in the cache's row order
    order = live
    running = loop
    narrows = loop.narrows and not keep_logits
    scores: list[np.ndarray] = []
    chosen: list[np.ndarray] = []
    for index in range(max_steps):
        step, past = running.run_step(running.per_row, past, history[live], offsets[live] + index, order)
        written = step.tokens(step.scores.argmax(axis=-1)).astype(np.int64)
        written = np.where(finished[live], loop.end, written)
        token = np.full(rows, loop.end, dtype=np.int64)
        token[live] = written
        log_probs = np.zeros(rows)  # a row that has left the loop writes the end again, unscored
        log_probs[live] = token_log_probs(step.scores, step.columns(written))
        history = np.concatenate([history, token[:, None]], axis=1)
        chosen.append(log_probs)
        if keep_logits:
            if step.ids is not None:
                raise ValueError("keep_logits needs a step graph that scores every token")
            scores.append(step.scores)
        finished[live] |= written == loop.end
        if finished.all():
            break
        order = np.arange(len(live), dtype=np.int64)
        if narrows and finished[live].any():
            still = np.flatnonzero(~finished[live])
            order, past = loop.continue_rows(still, past)
            live = live[still]
            running = loop.select(live)
    kept = np.stack(scores, axis=1) if keep_logits else None
    return Generated(history[:, 1:], np.stack(chosen, axis=1), finished, kept)


def token_log_probs(logits: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """log softmax(logits)[row, tokens[row]] without materialising the whole distribution. The
    exponentials stay in the logits' float32 and only their sum is float64: within 1e-5 of an
    all-float64 computation at a tenth of its time: over a 30k vocabulary that took a fifth as long
    as the step graph itself, every step."""
    top = logits.max(axis=-1, keepdims=True)
    shifted = logits - top
    normaliser = np.log(np.exp(shifted).sum(axis=-1, dtype=np.float64))
    return shifted[np.arange(len(tokens)), tokens].astype(np.float64) - normaliser


@dataclass(frozen=True)
class Hypothesis:
    tokens: tuple[int, ...]  # generated tokens after the first, end included when finished
    log_probs: tuple[float, ...]  # of each generated token

    @property
    def score(self) -> float:
        """Mean log-probability per token (length penalty 1, as BARTNER and SetGNER)."""
        return float(np.mean(self.log_probs)) if self.log_probs else 0.0


def log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def beam_search(loop: Loop, max_steps: int, beams: int, keep: np.ndarray) -> list[list[Hypothesis]]:
    """Beam search with `beams` hypotheses per row; per row, the `keep[row]` best finished ones
    (or the best unfinished when fewer finish), best first. The cache is reordered where it
    lives: by the step graph (`cache_order`), or by the loop's `reorder`.

    A row is complete once `beams` of its hypotheses have finished (or none is left alive), and is
    not extended after that: when a row stops depends on that row alone, never on the other rows
    of its batch (stopping once every row had `keep` finished ones made a sentence's entities
    depend on how long its batch's other sentences kept the loop going). Where the loop can
    narrow its rows (`Loop.narrows`), a complete row's beams also leave the step."""
    if loop.names.cache_order not in loop.step.input_names and loop.reorder is None:
        raise ValueError("beam search needs a step graph that takes cache_order, or the loop's reorder")
    rows = len(loop.first)
    slots = rows * beams
    per_slot = replace(
        loop,
        per_row={name: np.repeat(value, beams, axis=0) for name, value in loop.per_row.items()},
        first=np.repeat(loop.first, beams),
        offsets=np.repeat(loop.offsets if loop.offsets is not None else np.zeros(rows, dtype=np.int64), beams),
    )
    offsets = per_slot.offsets
    assert offsets is not None
    past: dict[str, Value] = dict(loop.cache.empty(slots))
    history = np.repeat(loop.first.astype(np.int64), beams)[:, None]
    totals = np.full(slots, -np.inf)
    totals[::beams] = 0.0  # one live beam per row at the start
    token_scores = np.zeros((slots, 0))
    searching = np.arange(rows)  # the rows the step runs, their beams' slots in `live`
    live = np.arange(slots)
    order = np.arange(slots, dtype=np.int64)
    running = per_slot
    done: list[list[Hypothesis]] = [[] for _ in range(rows)]
    complete = np.zeros(rows, dtype=bool)
    for index in range(max_steps):
        step, past = running.run_step(running.per_row, past, history[live], offsets[live] + index, order, spare=beams)
        logp = log_softmax(step.scores.astype(np.float64))
        candidates = totals[live][:, None] + logp  # [live slots, A]
        width = candidates.shape[1]
        best = np.argsort(-candidates.reshape(len(searching), beams * width), axis=1, kind="stable")[:, :beams]
        origin = ((best // width) + (np.arange(len(searching)) * beams)[:, None]).reshape(-1)  # of the step's rows
        column = (best % width).reshape(-1)
        token = step.tokens(column)
        history = np.concatenate([history, np.full((slots, 1), loop.end, dtype=np.int64)], axis=1)
        history[live] = np.concatenate([history[live[origin], :-1], token[:, None]], axis=1)
        token_scores = np.concatenate([token_scores, np.zeros((slots, 1))], axis=1)
        token_scores[live] = np.concatenate([token_scores[live[origin], :-1], logp[origin, column][:, None]], axis=1)
        totals[live] = candidates[origin, column]
        finished = np.zeros(slots, dtype=bool)
        finished[live] = (token == loop.end) & np.isfinite(totals[live])
        for slot in np.flatnonzero(finished):
            done[slot // beams].append(Hypothesis(tuple(history[slot, 1:].tolist()), tuple(token_scores[slot].tolist())))
        totals = np.where(finished, -np.inf, totals)  # a finished hypothesis leaves the beam
        alive = np.isfinite(totals).reshape(rows, beams).any(axis=1)
        complete |= (np.array([len(d) for d in done]) >= beams) | ~alive
        totals = np.where(np.repeat(complete, beams), -np.inf, totals)  # a complete row is not extended
        if complete.all():
            break
        order = origin.astype(np.int64)
        if per_slot.narrows and complete[searching].any():
            kept = np.flatnonzero(np.repeat(~complete[searching], beams))  # of the step's rows
            searching = searching[~complete[searching]]
            live = live[kept]
            running = per_slot.select(live)
            order = order[kept]
        order, past = per_slot.continue_rows(order, past)
    results = []
    for r in range(rows):
        ranked = sorted(done[r], key=lambda h: -h.score)
        if len(ranked) < keep[r]:  # too few finished: the best live ones fill in
            live_slots = [s for s in range(r * beams, (r + 1) * beams) if np.isfinite(totals[s])]
            ranked += [Hypothesis(tuple(history[s, 1:].tolist()), tuple(token_scores[s].tolist())) for s in live_slots]
        results.append(ranked[: keep[r]])
    return results
