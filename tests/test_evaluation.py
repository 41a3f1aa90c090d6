import pytest

from nerserve.ner.evaluation import evaluate
from nerserve.ner.types import Entity, EntitySet


def es(*entities: Entity) -> EntitySet:
    return EntitySet(entities)


def test_strict_micro_scores_and_breakdowns() -> None:
    outer, inner = Entity("PER", ((0, 3),)), Entity("GPE", ((0, 1),))
    gapped = Entity("ADR", ((3, 4), (6, 7)))
    gold = [es(outer, inner, gapped), es(Entity("ORG", ((1, 2),)))]
    predicted = [
        es(outer, Entity("GPE", ((0, 2),)), gapped),  # inner boundary wrong
        es(Entity("LOC", ((1, 2),)), Entity("ORG", ((2, 3),))),  # wrong type, spurious
    ]
    report = evaluate(zip(gold, predicted, strict=True))
    assert (report["gold"], report["predicted"], report["correct"]) == (4, 5, 2)
    assert report["precision"] == pytest.approx(2 / 5)
    assert report["recall"] == pytest.approx(2 / 4)
    assert report["f1"] == pytest.approx(2 * 0.4 * 0.5 / 0.9)
    assert report["sentences"] == 2
    assert report["by_type"]["PER"]["f1"] == 1.0
    assert report["by_type"]["ORG"]["recall"] == 0.0
    nested = report["nested"]
    assert (nested["gold"], nested["correct"]) == (2, 1)
    assert report["discontinuous"]["f1"] == 1.0
    assert report["errors"] == {
        "gold_not_found": {"boundary": 1, "type": 1},  # inner GPE (0,2 predicted); ORG predicted as LOC
        "predicted_not_gold": {"boundary": 1, "spurious": 1, "type": 1},  # ORG (2,3) overlaps no gold entity
        "nested_gold_not_found": {"boundary": 1},
        "discontinuous_gold_not_found": {},
        "type_confusions": {"ORG as LOC": 1},
    }


def test_an_error_overlapping_only_another_type_is_boundary_and_type() -> None:
    gold, predicted = es(Entity("PER", ((0, 2),))), es(Entity("ORG", ((1, 3),)))
    errors = evaluate([(gold, predicted)])["errors"]
    assert errors["gold_not_found"] == {"boundary_and_type": 1}
    assert errors["predicted_not_gold"] == {"boundary_and_type": 1}
    assert evaluate([(gold, es())])["errors"]["gold_not_found"] == {"missed": 1}


def test_score_does_not_count_and_empty_is_zero() -> None:
    a = Entity("X", ((0, 1),), score=0.9)
    b = Entity("X", ((0, 1),), score=0.1)
    assert evaluate([(es(a), es(b))])["f1"] == 1.0
    empty = evaluate([(es(), es())])
    assert empty["f1"] == 0.0 and empty["gold"] == 0


def test_entity_validation() -> None:
    with pytest.raises(ValueError):
        Entity("X", ((2, 2),))
    with pytest.raises(ValueError):
        Entity("X", ((0, 2), (2, 3)))
