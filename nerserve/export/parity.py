"""Parity: eager torch and exported graphs through the same program + decode on real sentences.

Batches mix sizes on purpose (batch 1, length-sorted batches of 16, and the longest sentences
together) because shape-specialisation bugs show only on shapes other than the example's.

Floating outputs must agree within TOLERANCE (INTERMEDIATE_TOLERANCE for an output another graph
takes in), or RELATIVE_TOLERANCE of the output's magnitude when that is larger
(`ParityReport.allowed`), and the decoded entity sets must be identical.
Integer outputs (adjusted spans, token ids, generated sequences) are discrete decisions taken on
floats: a difference of 1e-6 can round a boundary offset the other way, after which the scores
computed for that span are scores of another span and not comparable. So an integer output's
rows that differ are counted, and the floating outputs' rows that follow them (same leading axes)
are left out of the float comparison and counted too. Architectures whose decoder loops must
produce identical sequences (`strict_integers`): per-step logits within tolerance and identical
greedy sequences; a sequence that ends at another step (an output of another shape) is a failure,
not an error. Outside that, a few differing discrete decisions pass only while the entity sets
stay identical.

A decoder loop's eager reference runs after the exported one, teacher-forced along the tokens the
exported loop fed (export.teacher_forcing): one eager pass per loop instead of one per token, the
eager side's decisions still its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from nerserve.export.teacher_forcing import RecordedLoops, TeacherForcedSteps, step_graph_names, with_graphs
from nerserve.ner.archs.base import ProgramBase
from nerserve.ner.data import Sentence

PARITY_SENTENCES = 200
TOLERANCE = 1e-4
# Or RELATIVE_TOLERANCE of an output's largest |value| when that is larger (beyond a magnitude of 2):
# float32 carries ~7 digits, and six transformer layers' sums, ordered differently by ONNX Runtime and
# torch and by the thread count each picks, leave 1-1.3e-5 of an attention key's magnitude (gner-open's
# cross keys: 1.37e-4 on a key of 13.7 in a 200-sentence export; 1.77e-4 on it and 1.006e-4 on a key
# of ~9 in a start-up check of the longest sentences, with every generated id, every per-step
# log-prob within 1.2e-5 and every entity set identical). 5e-5 leaves ~4x that; probabilities,
# scores and log-probabilities near 0 keep the absolute TOLERANCE.
RELATIVE_TOLERANCE = 5e-5
# An intermediate (an output another graph of the set takes in, such as the encoder's BiLSTM word
# states) may differ by up to INTERMEDIATE_TOLERANCE: its effect is checked where it is taken in, on
# the outputs decoding reads (TOLERANCE) and on the entity sets. A recurrence carries float32's
# rounding along a long sentence's steps, and CPUs' LSTM kernels round differently
# (docs/decisions/export-parity.md); a graph that computes something else misses by far more.
INTERMEDIATE_TOLERANCE = 5e-4


def parity_batches(sentences: list[Sentence], count: int = PARITY_SENTENCES) -> list[list[list[str]]]:
    """`count` sentences: the longest together (16, or a quarter of `count` when that is fewer: a
    start-up check of 32 sentences takes the longest 8, since an autoregressive decoder's loop runs
    as long as its longest row and the eager reference spent most of a first start on 16 of them),
    then up to 40 (a quarter of the rest) one at a time, the rest in length-sorted batches of 16."""
    by_length = sorted(range(len(sentences)), key=lambda i: -len(sentences[i].tokens))
    longest = by_length[: min(16, max(2, count // 4))]
    taken = set(longest)
    rest = [i for i in range(len(sentences)) if i not in taken]
    step = max(1, len(rest) // max(1, count - len(longest)))
    chosen = rest[::step][: count - len(longest)]
    alone = min(40, len(chosen) // 4)
    single, grouped = chosen[:alone], sorted(chosen[alone:], key=lambda i: len(sentences[i].tokens))
    batches = [[list(sentences[i].tokens) for i in longest]]
    batches += [[list(sentences[i].tokens)] for i in single]
    batches += [[list(sentences[i].tokens) for i in grouped[k : k + 16]] for k in range(0, len(grouped), 16)]
    return batches


@dataclass
class ParityReport:
    sentences: int = 0
    batches: int = 0
    entities: int = 0  # in the reference's entity sets: parity on empty sets would prove little
    max_abs_diff: float = 0.0
    per_output: dict[str, float] = field(default_factory=dict)
    per_output_scale: dict[str, float] = field(default_factory=dict)  # largest |eager value| of each
    integer_values: int = 0  # integer outputs compared (token ids, spans, sequences)
    integer_mismatches: int = 0
    rows_not_compared: int = 0  # float rows after a differing integer decision
    shape_mismatches: dict[str, str] = field(default_factory=dict)
    entity_sets_identical: bool = True
    sentences_differing: int = 0
    strict_integers: bool = False
    eager_steps_teacher_forced: int = 0  # of the reference's decoder steps (export.teacher_forcing)
    intermediates: frozenset[str] = frozenset()  # outputs another graph takes in (INTERMEDIATE_TOLERANCE)

    def add_outputs(self, reference: dict[str, np.ndarray], exported: dict[str, np.ndarray]) -> None:
        comparable = {name: value for name, value in reference.items() if self._same_shape(name, value, exported[name])}
        differing: list[np.ndarray] = []  # per integer output: which rows (leading axes) differ
        for name, expected in comparable.items():
            if np.issubdtype(expected.dtype, np.integer):
                unequal = exported[name] != expected
                self.integer_values += int(expected.size)
                self.integer_mismatches += int(unequal.sum())
                differing.append(unequal.any(axis=-1) if unequal.ndim > 1 else unequal)
        for name, expected in comparable.items():
            if np.issubdtype(expected.dtype, np.integer):
                continue
            diff = np.abs(exported[name].astype(np.float64) - expected.astype(np.float64))
            for rows in differing:
                if rows.any() and diff.shape[: rows.ndim] == rows.shape:
                    self.rows_not_compared += int(rows.sum())
                    diff[rows] = 0.0
            worst = float(diff.max(initial=0.0))
            self.per_output[name] = max(self.per_output.get(name, 0.0), worst)
            scale = float(np.abs(expected).max(initial=0.0))
            self.per_output_scale[name] = max(self.per_output_scale.get(name, 0.0), scale)
            self.max_abs_diff = max(self.max_abs_diff, worst)

    def _same_shape(self, name: str, expected: np.ndarray, got: np.ndarray) -> bool:
        if got.shape != expected.shape:
            self.shape_mismatches.setdefault(name, f"{got.shape} != eager {expected.shape}")
            return False
        return True

    def allowed(self, name: str) -> float:
        """The largest |Δ| an output may show: TOLERANCE (INTERMEDIATE_TOLERANCE for an output another
        graph takes in), or RELATIVE_TOLERANCE of its largest |value| when that is larger."""
        floor = INTERMEDIATE_TOLERANCE if name in self.intermediates else TOLERANCE
        return max(floor, RELATIVE_TOLERANCE * self.per_output_scale.get(name, 0.0))

    def outputs_out_of_tolerance(self) -> set[str]:
        return {name for name, diff in self.per_output.items() if diff > self.allowed(name)}

    def integers_differ(self) -> bool:
        """Generated ids (or shapes) differ where they must be identical."""
        return self.strict_integers and (self.integer_mismatches > 0 or bool(self.shape_mismatches))

    def passed(self) -> bool:
        return not self.outputs_out_of_tolerance() and self.entity_sets_identical and not self.integers_differ()

    def misses(self) -> list[str]:
        """What keeps this report from passing, for a log line or an error: each output's |Δ|
        against its own bound, differing generated ids, differing entity sets."""
        out = sorted(self.outputs_out_of_tolerance())
        found = [f"{name} {self.per_output[name]:.2e} > {self.allowed(name):.2e}" for name in out]
        if self.integers_differ():
            found.append(f"{self.integer_mismatches} of {self.integer_values} generated ids differ")
        if not self.entity_sets_identical:
            found.append(f"entity sets differ in {self.sentences_differing} sentences")
        return found

    def to_dict(self) -> dict[str, Any]:
        return {
            "sentences": self.sentences,
            "batches": self.batches,
            "entities": self.entities,
            "max_abs_diff": self.max_abs_diff,
            "per_output": self.per_output,
            "per_output_allowed": {name: self.allowed(name) for name in self.per_output},
            "integer_values": self.integer_values,
            "integer_mismatches": self.integer_mismatches,
            "rows_not_compared": self.rows_not_compared,
            "shape_mismatches": self.shape_mismatches,
            "strict_integers": self.strict_integers,
            "eager_steps_teacher_forced": self.eager_steps_teacher_forced,
            "entity_sets_identical": self.entity_sets_identical,
            "sentences_differing": self.sentences_differing,
            "tolerance": TOLERANCE,
            "relative_tolerance": RELATIVE_TOLERANCE,
            "intermediate_tolerance": INTERMEDIATE_TOLERANCE,
            "intermediates": sorted(self.intermediates),
            "misses": self.misses(),
        }


Program = ProgramBase[Any, Any, Any]


@dataclass
class ReferenceRun:
    """One parity batch through the eager program: computed once, compared with every candidate
    export (an autoregressive model's eager run is most of a parity check's time)."""

    batch: Any
    outputs: dict[str, np.ndarray]
    entity_sets: list[Any]
    sentences: int
    # the exported program the eager loops were teacher-forced along, and its outputs (its own
    # check reuses them rather than running its graphs again)
    forced_along: Program | None = None
    forced_along_outputs: dict[str, np.ndarray] | None = None
    forced_steps: int = 0  # eager decoder steps answered from a teacher-forced pass


def reference_runs(reference: Program, batches: list[list[list[str]]], exported: Program | None = None) -> list[ReferenceRun]:
    """The eager program's runs of `batches`. With `exported` (the program over the exported
    graphs) and a decoder loop, each batch runs through `exported` first and the eager loops are
    teacher-forced along the tokens its loops fed (export.teacher_forcing): the same decisions,
    one decoder pass per loop instead of one per token."""
    steps = step_graph_names(reference.graphs)
    runs = []
    for sentences in batches:
        batch = reference.prepare(sentences)
        if exported is None or not steps:
            outputs = reference.run(batch)
            runs.append(ReferenceRun(batch, outputs, list(reference.decode(batch, outputs)), len(sentences)))
            continue
        recorders = {name: RecordedLoops(exported.graphs[name]) for name in steps}
        along = with_graphs(exported, recorders).run(batch)
        forced = {name: TeacherForcedSteps(reference.graphs[name], recorders[name].loops) for name in steps}
        outputs = with_graphs(reference, forced).run(batch)
        entity_sets = list(reference.decode(batch, outputs))
        count = sum(graph.forced_steps for graph in forced.values())
        runs.append(ReferenceRun(batch, outputs, entity_sets, len(sentences), exported, along, count))
    return runs


def check_parity(exported: Program, runs: list[ReferenceRun], strict_integers: bool = False) -> ParityReport:
    """`exported` runs the architecture's program over exported graphs; `runs` are the eager one's."""
    report = ParityReport(strict_integers=strict_integers, intermediates=intermediates(exported))
    for run in runs:
        got = run.forced_along_outputs if run.forced_along is exported else None
        if got is None:
            got = exported.run(run.batch)
        report.eager_steps_teacher_forced += run.forced_steps
        report.add_outputs(run.outputs, got)
        for a, b in zip(run.entity_sets, exported.decode(run.batch, got), strict=True):
            report.entities += len(a)
            if a.keys() != b.keys():
                report.entity_sets_identical = False
                report.sentences_differing += 1
        report.sentences += run.sentences
        report.batches += 1
    return report


def intermediates(program: Program) -> frozenset[str]:
    """The outputs of a program's graphs that one of its graphs takes in."""
    taken = {name for graph in program.graphs.values() for name in graph.input_names}
    return frozenset(name for graph in program.graphs.values() for name in graph.output_names if name in taken)
