import itertools

from ner.types import Entity, EntitySet
from service.pipeline import Planner, assemble, windows


def test_window_cores_partition_the_sentence() -> None:
    counts = [3] * 50
    spans = windows(counts, budget=30, overlap=4)
    assert len(spans) > 1
    assert all(sum(counts[s:e]) <= 30 for s, e, _, _ in spans)
    cores = [(cs, ce) for _, _, cs, ce in spans]
    assert cores[0][0] == 0 and cores[-1][1] == 50
    assert all(a[1] == b[0] for a, b in itertools.pairwise(cores))
    assert all(s <= cs < ce <= e for s, e, cs, ce in spans)


def test_offsets_are_exact_and_window_duplicates_merge(tiny_backbone) -> None:
    from ner.text.subword import load_tokenizer

    text = "  Peter  Blackburn went to Köln.\tThen   he left."
    planner = Planner(load_tokenizer(tiny_backbone), window_subwords=6, overlap_words=2)
    [planned] = planner.plan(texts=[text])
    assert len(planned.units) > 2  # windowed: 4 sub-words (+2 specials) per window
    everyone = EntitySet({Entity("PER", ((0, 2),)), Entity("LOC", ((4, 5),))})
    shifted = []
    for unit in planned.units:  # every window "finds" the entities it contains
        local = [
            Entity(e.type, tuple((s - unit.word_offset, t - unit.word_offset) for s, t in e.fragments))
            for e in everyone
            if e.start >= unit.word_offset and e.end <= unit.word_offset + len(unit.words)
        ]
        shifted.append(EntitySet(local))
    entities = assemble(planned, shifted)
    assert [(e["type"], e["text"]) for e in entities] == [("PER", "Peter  Blackburn"), ("LOC", "Köln")]
    for entity in entities:
        assert all(text[a:b] for a, b in entity["spans"])
        assert entity["text"] == " ".join(text[a:b] for a, b in entity["spans"])
