"""Export parity's eager reference for decoder loops, in one teacher-forced pass per loop.

An autoregressive program calls its step graph once per generated token; in eager torch each call
is dozens of small kernels and Python dispatch, so the eager side of a generative model's parity
check was most of its export (docs/decisions/export-parity.md has the figures). But the eager
step graphs also take T tokens per row at once (tokens, positions [R, T]: the decoder's
training-time form). So the exported program runs first and each of its loops' fed tokens are
recorded (`RecordedLoops`); the eager program then runs its own loop as before, and its step graph
(`TeacherForcedSteps`) answers every step from one pass over the recorded tokens, for as long as
the eager loop feeds exactly those tokens at those positions with its own cache. It chooses every
token itself from those logits: a loop whose greedy choice departs from the recorded one, a beam
search (which reorders the cache), or any call it cannot match is computed step by step as
before, from that step on. The reference stays the eager program's own decisions; only how its
logits are computed changes (causal attention over the whole sequence instead of a growing cache:
the same sums up to float rounding, ~1e-6 against the parity bound of 1e-4).
"""

from __future__ import annotations

import copy
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from nerserve.ner.decoding.generation import StepNames
from nerserve.ner.graph import PAST, Graph, Value, present_of

NAMES = StepNames()


def step_graph_names(graphs: Mapping[str, Graph]) -> list[str]:
    """The graphs a decoder loop calls step by step: those that take a key/value cache."""
    return [name for name, graph in graphs.items() if any(n.startswith(PAST) for n in graph.input_names)]


def with_graphs(program: Any, replaced: Mapping[str, Graph]) -> Any:
    """A copy of `program` that runs `replaced` instead of its graphs of those names."""
    twin = copy.copy(program)
    twin.graphs = {**program.graphs, **replaced}
    return twin


def _starts_a_loop(inputs: Mapping[str, Value], past: list[str]) -> bool:
    """A loop's first call feeds the empty cache (numpy with no positions; later steps feed what
    the runtime answered, which may be its own device values)."""
    first = inputs[past[0]]
    return isinstance(first, np.ndarray) and first.shape[2] == 0


@dataclass
class Step:
    tokens: np.ndarray  # [rows]
    positions: np.ndarray  # [rows]
    vocabulary: np.ndarray | None = None  # [A]: the tokens it scored, for a step graph that takes them
    # [rows]: the row of the step before whose cache each row continues (a greedy loop drops its
    # finished rows this way); None: every row its own
    order: np.ndarray | None = None


@dataclass(frozen=True)
class Draft:
    """A recorded loop over all the rows it started with: `steps[t]` holds every starting row's
    token and position (a row that has left the loop repeats its last token at its last position,
    which causal attention never lets an earlier position read) and `live[t]` the rows step t ran,
    in the order it ran them (a greedy loop drops its finished rows)."""

    steps: list[Step]
    live: list[np.ndarray]

    @classmethod
    def of(cls, recorded: list[Step]) -> Draft | None:
        """The loop's draft up to its first step that reorders rows rather than dropping some
        (beam search's second), or None where its first step is not every row in order."""
        if not recorded:
            return None
        live = np.arange(len(recorded[0].tokens), dtype=np.int64)
        tokens, positions = recorded[0].tokens, recorded[0].positions
        steps, lives = [], []
        for step in recorded:
            order = np.arange(len(live)) if step.order is None else step.order
            if not _drops_rows(order, len(live)) or len(step.tokens) != len(order):
                break
            live = live[order]
            tokens, positions = tokens.copy(), positions.copy()
            tokens[live], positions[live] = step.tokens, step.positions
            steps.append(Step(tokens, positions, step.vocabulary))
            lives.append(live)
        return cls(steps, lives) if steps else None


def _drops_rows(order: np.ndarray, rows: int) -> bool:
    """Whether a step's `cache_order` continues some of the `rows` before it, each once, in order."""
    return len(order) > 0 and bool(np.all(np.diff(order) > 0)) and order[0] >= 0 and order[-1] < rows


def _same_vocabulary(fed: Value | None, recorded: np.ndarray | None) -> bool:
    if fed is None or recorded is None:
        return fed is None and recorded is None
    return np.array_equal(fed, recorded)


class _StepGraphWrapper:
    """A step graph standing in for `graph` under the Graph protocol, knowing its cache inputs."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.input_names, self.output_names = graph.input_names, graph.output_names
        self.device_resident, self.execution_provider = graph.device_resident, graph.execution_provider
        self.past = [n for n in graph.input_names if n.startswith(PAST)]


class RecordedLoops(_StepGraphWrapper):
    """A step graph that records, for each loop run through it, the tokens and positions fed at
    each step (a loop starts at the empty cache)."""

    def __init__(self, graph: Graph) -> None:
        super().__init__(graph)
        self.loops: list[list[Step]] = []
        self._last: Value = None  # the first cache output of the step before

    def run(self, inputs: Mapping[str, Value], keep_on_device: Collection[str] = ()) -> dict[str, Value]:
        starts = _starts_a_loop(inputs, self.past) or not self.loops
        if starts:
            self.loops.append([])
        vocabulary = inputs.get(NAMES.vocabulary)
        tokens, positions = np.array(inputs[NAMES.token]), np.array(inputs[NAMES.position])
        order = inputs.get(NAMES.cache_order)
        if order is None and not starts and inputs[self.past[0]] is not self._last:
            # the loop took rows of the cache itself (its `reorder`): which ones, by their values
            order = _rows_taken(inputs[self.past[0]], self._last)
        self.loops[-1].append(
            Step(
                tokens,
                positions,
                None if vocabulary is None else np.array(vocabulary),
                None if order is None else np.array(order),
            )
        )
        outputs = self.graph.run(inputs, keep_on_device)
        self._last = outputs[present_of(self.past[0])]
        return outputs


def _rows_taken(taken: Value, rows: Value) -> np.ndarray:
    """Which of `rows` make up `taken`, in order, each once (a loop's cache after it dropped
    finished rows); an empty order where that is not so or the values are not on the host."""
    if not (isinstance(taken, np.ndarray) and isinstance(rows, np.ndarray)) or taken.shape[1:] != rows.shape[1:]:
        return np.zeros(0, dtype=np.int64)
    order, start = [], 0
    for row in taken:
        found = next((r for r in range(start, len(rows)) if np.array_equal(rows[r], row)), None)
        if found is None:
            return np.zeros(0, dtype=np.int64)
        order.append(found)
        start = found + 1
    return np.array(order, dtype=np.int64)


class TeacherForcedSteps(_StepGraphWrapper):
    """An eager step graph that answers a loop's steps from passes over the tokens a recorded loop
    fed (the k-th loop it sees takes the k-th recorded one), CHUNK steps a pass so that the
    scores of a long loop's every step and token never sit in memory at once, while each call
    matches: the recorded step's rows, tokens, positions and scored vocabulary, the cache this
    wrapper answered at the step before, and the same other inputs as at the loop's start (an input
    per row: those of the rows still running). Any other call runs the step graph itself, and so
    does every later step of that loop. A pass runs every row the loop started with and scores
    the union of its steps' vocabularies; each step answers its own rows and columns of it."""

    CHUNK = 64

    def __init__(self, graph: Graph, drafts: list[list[Step]]) -> None:
        super().__init__(graph)
        self.present = [present_of(n) for n in self.past]
        self.drafts = drafts
        # a step graph answering more than its scores, states and cache is always run step by step
        outputs = set(graph.output_names)
        self.answerable = {NAMES.logits, *self.present} <= outputs <= {NAMES.logits, NAMES.states, *self.present}
        self.loops_seen = 0
        self.forced_steps = 0  # steps answered from a teacher-forced pass (tests check it is used)
        self._draft: Draft | None = None
        self._recorded: list[Step] = []
        self._fixed: dict[str, Value] = {}  # the loop's inputs other than the steps' and the cache
        self._cache: dict[str, Value] = {}  # the cache the next pass continues (empty at the start)
        self._outputs: dict[str, np.ndarray] = {}  # the current pass's
        self._union: np.ndarray | None = None  # the vocabulary the current pass scored
        self._first = 0  # the step the current pass starts at
        self._answered: dict[str, Value] = {}
        self._step = 0

    def run(self, inputs: Mapping[str, Value], keep_on_device: Collection[str] = ()) -> dict[str, Value]:
        if _starts_a_loop(inputs, self.past):
            self._start(inputs)
        if self._matches(inputs):
            return self._answer()
        self._draft = None
        return self.graph.run(inputs, keep_on_device)

    def _start(self, inputs: Mapping[str, Value]) -> None:
        recorded = self.drafts[self.loops_seen] if self.loops_seen < len(self.drafts) else []
        self.loops_seen += 1
        self._draft, self._step, self._answered, self._outputs = None, 0, {}, {}
        draft = Draft.of(recorded)
        if not self.answerable or draft is None or len(draft.live[0]) != len(inputs[NAMES.token]):
            return
        per_step = (*self.past, NAMES.token, NAMES.position, NAMES.vocabulary)
        self._fixed = {name: value for name, value in inputs.items() if name not in per_step}
        if NAMES.cache_order in self._fixed:
            self._fixed[NAMES.cache_order] = draft.live[0]
        self._cache = {name: inputs[name] for name in self.past}
        self._draft, self._recorded = draft, recorded

    def _matches(self, inputs: Mapping[str, Value]) -> bool:
        draft = self._draft
        if draft is None or self._step >= len(draft.steps):
            return False
        expected, live = self._recorded[self._step], draft.live[self._step]
        order, vocabulary = inputs.get(NAMES.cache_order), inputs.get(NAMES.vocabulary)
        if not (
            np.array_equal(inputs[NAMES.token], expected.tokens)
            and np.array_equal(inputs[NAMES.position], expected.positions)
            and (order is None or np.array_equal(order, np.arange(len(order)) if expected.order is None else expected.order))
            and _same_vocabulary(vocabulary, expected.vocabulary)
        ):
            return False
        if self._step == 0:  # the loop's start: its other inputs are the pass's, its cache empty
            return True
        same_inputs = all(
            _same_rows(inputs[name], value, live) for name, value in self._fixed.items() if name != NAMES.cache_order
        )
        return same_inputs and self._own_cache(inputs, expected.order)

    def _own_cache(self, inputs: Mapping[str, Value], order: np.ndarray | None) -> bool:
        """Whether the cache fed is the one this wrapper answered at the step before, or (taken
        by the loop's `reorder`, without `cache_order`) its rows in `order`."""
        pairs = [(inputs[past], self._answered[present]) for past, present in zip(self.past, self.present, strict=True)]
        if all(fed is answered for fed, answered in pairs):
            return True
        if order is None or NAMES.cache_order in inputs:
            return False
        return all(isinstance(fed, np.ndarray) and np.array_equal(fed, np.asarray(answered)[order]) for fed, answered in pairs)

    def _forward(self) -> None:
        """The next pass: up to CHUNK recorded steps from the current one, after the cache so far."""
        assert self._draft is not None
        chunk = self._draft.steps[self._step : self._step + self.CHUNK]
        steps = {
            NAMES.token: np.stack([step.tokens for step in chunk], axis=1),
            NAMES.position: np.stack([step.positions for step in chunk], axis=1),
        }
        vocabularies = [step.vocabulary for step in chunk if step.vocabulary is not None]
        self._union = np.unique(np.concatenate(vocabularies)) if vocabularies else None
        if self._union is not None:
            steps[NAMES.vocabulary] = self._union
        outputs = self.graph.run({**self._fixed, **self._cache, **steps})
        self._outputs = {name: np.asarray(value) for name, value in outputs.items()}
        self._cache = {past: self._outputs[present] for past, present in zip(self.past, self.present, strict=True)}
        self._first = self._step

    def _answer(self) -> dict[str, Value]:
        assert self._draft is not None
        t = self._step
        if not self._outputs or t - self._first >= self._outputs[NAMES.logits].shape[1]:
            self._forward()
        live = self._draft.live[t]
        rows = slice(None) if len(live) == len(self._draft.live[0]) else live
        logits = self._outputs[NAMES.logits][rows, t - self._first]
        vocabulary = self._draft.steps[t].vocabulary
        if self._union is not None and vocabulary is not None:
            logits = logits[:, np.searchsorted(self._union, vocabulary)]
        answer: dict[str, Value] = {NAMES.logits: logits}
        if NAMES.states in self._outputs:
            answer[NAMES.states] = self._outputs[NAMES.states][rows, t - self._first]
        answer.update({name: self._outputs[name][rows, :, : t + 1] for name in self.present})
        self._answered = answer
        self._step += 1
        self.forced_steps += 1
        return answer


def _same_rows(fed: Value, started: Value, live: np.ndarray) -> bool:
    """Whether an input fed at a step is the one the loop started with, or (an input per row, on
    the host) its rows still running."""
    if fed is started:
        return True
    return (
        isinstance(fed, np.ndarray)
        and isinstance(started, np.ndarray)
        and len(started) != len(fed) == len(live)
        and np.array_equal(fed, started[live])
    )
