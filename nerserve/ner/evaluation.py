"""Strict micro precision / recall / F1 over entity sets, with the breakdowns the papers report.

An entity is correct only when its type and every fragment match a gold entity exactly.
Breakdowns: by type; nested (gold entities overlapping another gold entity, and predictions
overlapping another prediction); discontinuous (more than one fragment). Errors: each gold entity
not found and each wrong prediction, by what went wrong (the usual taxonomy: type only, boundary
only, both, or nothing overlapping at all), overall and for nested and discontinuous gold entities:
what to change next depends on which of these dominates.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Set
from dataclasses import dataclass, field, fields
from typing import Any

from nerserve.ner.types import Entity, EntitySet


@dataclass
class Counts:
    gold: int = 0
    predicted: int = 0
    correct: int = 0

    def add(self, gold: Set[object], predicted: Set[object]) -> None:
        self.gold += len(gold)
        self.predicted += len(predicted)
        self.correct += len(gold & predicted)

    def scores(self) -> dict[str, float | int]:
        precision = self.correct / self.predicted if self.predicted else 0.0
        recall = self.correct / self.gold if self.gold else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        return {
            "precision": precision,
            "recall": recall,
            "f1": f1,
            "gold": self.gold,
            "predicted": self.predicted,
            "correct": self.correct,
        }


def _overlapping(entities: EntitySet) -> set[Entity]:
    """Entities that share a word with another entity of the same set (nested or crossing)."""
    listed = list(entities)
    return {a for i, a in enumerate(listed) for j, b in enumerate(listed) if i != j and a.overlaps(b)}


def error_kind(entity: Entity, others: EntitySet, nothing: str) -> str:
    """Why ENTITY has no exact match among OTHERS: "type" (same fragments, another type),
    "boundary" (an overlapping one of the same type), "boundary_and_type" (an overlapping one of
    another type), else NOTHING ("missed" for a gold entity, "spurious" for a prediction)."""
    overlapping = [o for o in others if o.overlaps(entity)]
    if any(o.fragments == entity.fragments for o in overlapping):
        return "type"
    if any(o.type == entity.type for o in overlapping):
        return "boundary"
    return "boundary_and_type" if overlapping else nothing


@dataclass
class ErrorTally:
    gold_not_found: Counter[str] = field(default_factory=Counter)
    predicted_not_gold: Counter[str] = field(default_factory=Counter)
    nested_gold_not_found: Counter[str] = field(default_factory=Counter)
    discontinuous_gold_not_found: Counter[str] = field(default_factory=Counter)
    type_confusions: Counter[str] = field(default_factory=Counter)  # "GOLD as PREDICTED", same fragments

    def add(self, gold: EntitySet, predicted: EntitySet, nested_gold: set[Entity]) -> None:
        predicted_keys, gold_keys = predicted.keys(), gold.keys()
        for entity in gold:
            if entity.key() in predicted_keys:
                continue
            kind = error_kind(entity, predicted, "missed")
            self.gold_not_found[kind] += 1
            if kind == "type":
                self.type_confusions.update(f"{entity.type} as {o.type}" for o in predicted if o.fragments == entity.fragments)
            if entity in nested_gold:
                self.nested_gold_not_found[kind] += 1
            if entity.is_discontinuous:
                self.discontinuous_gold_not_found[kind] += 1
        for entity in predicted:
            if entity.key() not in gold_keys:
                self.predicted_not_gold[error_kind(entity, gold, "spurious")] += 1

    def report(self) -> dict[str, dict[str, int]]:
        """Each tally, most frequent first (ties by name: the same order on every run)."""
        return {f.name: dict(sorted(getattr(self, f.name).items(), key=lambda kv: (-kv[1], kv[0]))) for f in fields(self)}


@dataclass
class Evaluator:
    overall: Counts = field(default_factory=Counts)
    by_type: dict[str, Counts] = field(default_factory=dict)
    nested: Counts = field(default_factory=Counts)
    discontinuous: Counts = field(default_factory=Counts)
    errors: ErrorTally = field(default_factory=ErrorTally)
    sentences: int = 0

    def add(self, gold: EntitySet, predicted: EntitySet) -> None:
        self.sentences += 1
        self.overall.add(set(gold.keys()), set(predicted.keys()))
        for label in {e.type for e in gold} | {e.type for e in predicted}:
            counts = self.by_type.setdefault(label, Counts())
            counts.add(_of_type(gold, label), _of_type(predicted, label))
        nested_gold, nested_pred = _overlapping(gold), _overlapping(predicted)
        self.nested.add(_keys(gold, nested_gold.__contains__), _keys(predicted, nested_pred.__contains__))
        self.discontinuous.add(_keys(gold, lambda e: e.is_discontinuous), _keys(predicted, lambda e: e.is_discontinuous))
        self.errors.add(gold, predicted, nested_gold)

    def report(self) -> dict[str, Any]:
        result: dict[str, Any] = dict(self.overall.scores())
        result["sentences"] = self.sentences
        result["by_type"] = {label: c.scores() for label, c in sorted(self.by_type.items())}
        result["nested"] = self.nested.scores()
        result["discontinuous"] = self.discontinuous.scores()
        result["errors"] = self.errors.report()
        return result


def _of_type(entities: EntitySet, label: str) -> set[object]:
    return {e.key() for e in entities if e.type == label}


def _keys(entities: EntitySet, keep: Callable[[Entity], bool]) -> set[object]:
    return {e.key() for e in entities if keep(e)}


def evaluate(pairs: Iterable[tuple[EntitySet, EntitySet]]) -> dict[str, Any]:
    """Score (gold, predicted) pairs, one per sentence."""
    evaluator = Evaluator()
    for gold, predicted in pairs:
        evaluator.add(gold, predicted)
    return evaluator.report()
