import itertools
import pickle

import pytest

from nerserve.ner.text.segment import WordStyle
from nerserve.ner.text.subword import SubwordEncoder, load_tokenizer
from nerserve.ner.types import Entity, EntitySet
from nerserve.service.pipeline import Planner, PlanningRule, TooManySentences, Unit, assemble, windows


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

    text = "  Peter  Blackburn went to Köln.\tThen   he left."
    planner = Planner(SubwordEncoder(load_tokenizer(tiny_backbone)), window_subwords=6, overlap_words=2)
    [planned] = planner.plan(texts=[text])
    assert len(planned.units) > 2  # windowed: 4 sub-words (+2 specials) per window
    everyone = EntitySet({Entity("PER", ((0, 2),)), Entity("LOC", ((4, 5),))})
    shifted = []
    for unit in planned.units:  # every window "finds" the entities it contains
        local = [
            Entity(e.type, tuple((s - unit.word_offset, t - unit.word_offset) for s, t in e.fragments))
            for e in everyone
            if e.start >= unit.word_offset and e.end <= unit.word_offset + len(unit.sentence.words)
        ]
        shifted.append(EntitySet(local))
    entities = assemble(planned, shifted)
    # offsets counted by hand in code points: "  Peter  Blackburn" → [2, 18), "Köln" → [27, 31)
    assert [(e["type"], e["text"], e["spans"], e["token_spans"]) for e in entities] == [
        ("PER", "Peter  Blackburn", [(2, 18)], [(0, 2)]),
        ("LOC", "Köln", [(27, 31)], [(4, 5)]),
    ]


def test_units_reuse_the_sentence_tokenisation(tiny_backbone) -> None:
    """The planner tokenises once; the program's batch from its units is what tokenising the
    words again would give (same ids and word → sub-word map)."""

    encoder = SubwordEncoder(load_tokenizer(tiny_backbone))
    planner = Planner(encoder, window_subwords=384, overlap_words=2)
    [planned] = planner.plan(tokens=[["Peter", "Blackburn", "visited", "Köln", "\u200b", "."]])
    [unit] = planned.units
    again = encoder.encode([list(unit.sentence.words)])
    reused = encoder.encode([unit.sentence])
    assert reused.input_ids.tolist() == again.input_ids.tolist()
    assert reused.pieces == again.pieces
    plain = encoder.tokenizer.encode(["Peter", "Blackburn", "visited", "Köln", "x", "."], is_pretokenized=True)
    assert unit.cost == reused.input_ids.shape[1] == len(plain.ids)


def test_windows_of_long_words_advance_by_half_a_window() -> None:
    """100 words of 19 sub-words ("a-a-a-a-a-a-a-a-a-a") in a 382-sub-word budget with a 24-word
    overlap: 20 words fit a window, so an overlap of 24 would advance one word at a time (81
    windows, seconds of work for 2 KB). Each window now advances by half of itself at least."""
    counts = [19] * 100
    spans = windows(counts, budget=382, overlap=24)
    assert len(spans) <= 2 * 100 * 19 // 382 + 1
    assert sum(sum(counts[s:e]) for s, e, _, _ in spans) <= 2 * sum(counts) + 382
    cores = [(cs, ce) for _, _, cs, ce in spans]
    assert cores[0][0] == 0 and cores[-1][1] == 100
    assert all(a[1] == b[0] for a, b in itertools.pairwise(cores))


def test_a_sentence_that_fits_is_one_unit_as_the_window_rule_would_make_it(tiny_backbone) -> None:
    """A sentence within the budget (nearly all of them) is one window, the whole sentence, at its
    own cost; one sub-word more and the sentence is windowed."""

    encoder = SubwordEncoder(load_tokenizer(tiny_backbone))
    words = ["Peter", "Blackburn", "visited", "Köln", "."]
    [tokenized] = encoder.tokenize([words])
    counts = [len(piece) for piece in tokenized.pieces]
    fits = sum(counts) + encoder.special_count
    [planned] = Planner(encoder, window_subwords=fits, overlap_words=2).plan(tokens=[words])
    assert windows(counts, fits - encoder.special_count, 2) == [(0, len(words), 0, len(words))]
    assert planned.units == [Unit(0, tokenized, 0, (0, len(words)), fits)]
    [windowed] = Planner(encoder, window_subwords=fits - 1, overlap_words=2).plan(tokens=[words])
    assert len(windowed.units) > 1 and all(unit.cost < fits for unit in windowed.units)


def test_a_worker_plans_as_the_engine_does(tiny_backbone) -> None:
    """An HTTP worker rebuilds a model's planner from its PlanningRule and sends the units it
    planned to the engine; the engine sends back entity sets. Both cross a process by pickle."""
    import pickle

    from nerserve.ner.text.chars import CharRows, char_rows
    from nerserve.ner.text.subword import SubwordEncoder, Tokenized, load_tokenizer
    from nerserve.service.api.extraction import PlannedQuery, UnitAnswers
    from nerserve.service.pipeline import PlanningRule

    rule = PlanningRule.of(tiny_backbone, window_subwords=8, overlap_words=2)
    texts = ["Peter Blackburn visited Köln. He met Angela Merkel in Brussels on Friday afternoon."]
    engine_side = rule.planner(SubwordEncoder(load_tokenizer(tiny_backbone))).plan(texts)
    worker_side = pickle.loads(pickle.dumps(rule)).planner().plan(texts)
    units = [(unit.sentence, unit.cost) for unit in worker_side[0].units]
    assert len(units) > 2  # windows too
    received = pickle.loads(pickle.dumps(units))
    assert received == [(unit.sentence, unit.cost) for unit in engine_side[0].units]
    # the worker made each sentence's character features; the engine receives them made
    assert all("char_rows" in sentence.__dict__ for sentence, _ in received)
    assert [sentence.char_rows for sentence, _ in received] == [char_rows(sentence.words) for sentence, _ in units]
    assert all(type(sentence.char_rows) is CharRows for sentence, _ in received)
    bare = Tokenized(units[0][0].words, units[0][0].ids, units[0][0].counts)  # no features made: none sent
    assert "char_rows" not in pickle.loads(pickle.dumps(bare)).__dict__
    found = EntitySet({Entity("PER", ((0, 2),), 0.75), Entity("LOC", ((1, 2), (3, 4)), 0.5)})
    back = pickle.loads(pickle.dumps(found))
    assert back == found and {e.score for e in back} == {0.75, 0.5}
    # the request and its answer as they cross the engine link, each field back in its place
    query = PlannedQuery(units, ["PER"], {"threshold": 0.5}, 250.0, "texts")
    assert pickle.loads(pickle.dumps(query)) == query
    answers = UnitAnswers([found, EntitySet()], {"PER"}, 0.001, 0.002)
    assert pickle.loads(pickle.dumps(answers)) == answers


def test_a_request_over_the_sentence_limit_is_refused_before_it_is_tokenised(tiny_backbone) -> None:
    class Untokenised(SubwordEncoder):
        def tokenize(self, sentences):  # type: ignore[no-untyped-def]
            raise AssertionError("tokenised")

    planner = Planner(Untokenised(load_tokenizer(tiny_backbone)), window_subwords=64, overlap_words=2)
    with pytest.raises(TooManySentences) as refused:
        planner.plan(["Go on. " * 11, "Stop."], max_sentences=10)
    assert refused.value.count == 12


def test_a_models_planning_rule_cuts_words_in_its_style_in_any_process(tiny_backbone) -> None:
    """An HTTP worker rebuilds a model's planner from its rule (pickled): the words are the style's."""
    genia = WordStyle(slashes=True, brackets=True, primes=True)
    rule = pickle.loads(pickle.dumps(PlanningRule.of(tiny_backbone, 384, 24, genia)))
    text = "NF-kappa B p50/p65 binds 1,25(OH)2D3 ."
    [styled] = rule.planner().plan(texts=[text])
    [plain] = PlanningRule.of(tiny_backbone, 384, 24).planner().plan(texts=[text])
    assert [w.text for w in styled.words] == ["NF-kappa", "B", "p50/p65", "binds", "1,25(OH)2D3", "."]
    assert len(plain.words) == 12  # "p50 / p65", "1,25 ( OH ) 2D3"
