"""Strict micro precision / recall / F1 over entity sets, with the breakdowns the papers report.

An entity is correct only when its type and every fragment match a gold entity exactly.
Breakdowns: by type; nested (gold entities overlapping another gold entity, and predictions
overlapping another prediction); discontinuous (more than one fragment).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Set
from dataclasses import dataclass, field

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


@dataclass
class Evaluator:
    overall: Counts = field(default_factory=Counts)
    by_type: dict[str, Counts] = field(default_factory=dict)
    nested: Counts = field(default_factory=Counts)
    discontinuous: Counts = field(default_factory=Counts)
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

    def report(self) -> dict[str, object]:
        result: dict[str, object] = dict(self.overall.scores())
        result["sentences"] = self.sentences
        result["by_type"] = {label: c.scores() for label, c in sorted(self.by_type.items())}
        result["nested"] = self.nested.scores()
        result["discontinuous"] = self.discontinuous.scores()
        return result


def _of_type(entities: EntitySet, label: str) -> set[object]:
    return {e.key() for e in entities if e.type == label}


def _keys(entities: EntitySet, keep: Callable[[Entity], bool]) -> set[object]:
    return {e.key() for e in entities if keep(e)}


def evaluate(pairs: Iterable[tuple[EntitySet, EntitySet]]) -> dict[str, object]:
    """Score (gold, predicted) pairs, one per sentence."""
    evaluator = Evaluator()
    for gold, predicted in pairs:
        evaluator.add(gold, predicted)
    return evaluator.report()
