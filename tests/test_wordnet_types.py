"""WordNet sub-types of a mention's label, read from a small database in WordNet's own file format
(wndb(5), what Debian's wordnet-base installs), and the training examples they rename."""

import random

import pytest

from nerserve.ner.data import Sentence
from nerserve.ner.training.gliner_trainer import Source, Widening, ask, common_noun_example
from nerserve.ner.training.wordnet_types import MentionTypes, WordNet
from nerserve.ner.types import Entity, EntitySet

# offset: (words, hypernyms, instance hypernyms); a filler chain makes the kinds deep enough to name
SYNSETS: dict[int, tuple[tuple[str, ...], tuple[int, ...], tuple[int, ...]]] = {
    1: (("entity",), (), ()),
    2: (("physical_entity",), (1,), ()),
    3: (("object",), (2,), ()),
    4: (("location",), (3,), ()),
    5: (("region",), (4,), ()),
    6: (("geographical_area",), (5,), ()),
    7: (("urban_area",), (6,), ()),
    8: (("municipality",), (7,), ()),
    9: (("city", "metropolis"), (8,), ()),
    10: (("Houston",), (), (9,)),
    11: (("Dallas",), (), (9,)),
    12: (("body_of_water",), (6,), ()),
    13: (("stream",), (12,), ()),
    14: (("river",), (13,), ()),
    15: (("bayou",), (13,), ()),
    16: (("person",), (2,), ()),
    17: (("leader",), (16,), ()),
    18: (("politician",), (17,), ()),
    19: (("statesman",), (18,), ()),
    20: (("Houston", "Sam_Houston"), (), (19,)),
    21: (("Lithuania",), (), (6,)),
    22: (("road",), (6,), ()),
    23: (("highway",), (22,), ()),
    24: (("street",), (22,), ()),
    25: (("light",), (3,), ()),
    26: (("town",), (8,), ()),
}
SENSES = {"houston": (20, 10), "dallas": (11,), "city": (9,), "location": (4,), "river": (14,), "bayou": (15,),
          "body_of_water": (12,), "person": (16,), "lithuania": (21,), "stream": (13,), "road": (22,),
          "highway": (23,), "street": (24,), "light": (25,), "town": (26,)}  # fmt: skip


@pytest.fixture(scope="module")
def wordnet(tmp_path_factory: pytest.TempPathFactory) -> WordNet:
    folder = tmp_path_factory.mktemp("wordnet")
    lines = ["  1 This software and database is being provided ... (the licence header)"]
    for offset, (words, hypernyms, instances) in SYNSETS.items():
        pointers = [f"@ {h:08d} n 0000" for h in hypernyms] + [f"@i {h:08d} n 0000" for h in instances]
        pointers.append("+ 00499642 v 0101")  # another kind of pointer, to another part of speech
        named = " ".join(f"{w} 0" for w in words)
        lines.append(f"{offset:08d} 15 n {len(words):02x} {named} {len(pointers):03d} {' '.join(pointers)} | a gloss  ")
    (folder / "data.noun").write_text("\n".join(lines) + "\n", encoding="utf-8")
    index = [f"{lemma} n {len(s)} 1 @ {len(s)} 0 {' '.join(f'{x:08d}' for x in s)}  " for lemma, s in sorted(SENSES.items())]
    (folder / "index.noun").write_text("\n".join(["  1 licence header", *index]) + "\n", encoding="utf-8")
    (folder / "index.verb").write_text("  1 licence header\nlight v 1 0 1 0 00000001  \n", encoding="utf-8")
    for part in ("adj", "adv"):
        (folder / f"index.{part}").write_text("  1 licence header\n", encoding="utf-8")
    (folder / "noun.exc").write_text("cities city\n", encoding="utf-8")
    return WordNet.load(folder)


def test_a_mention_gets_the_kinds_strictly_below_its_label(wordnet: WordNet) -> None:
    types = MentionTypes(wordnet)
    # Houston's first sense is the statesman, no kind of location: the city sense answers
    assert types.types(("Houston",), "location") == ("city", "municipality", "urban area", "geographical area")
    assert types.types(("Houston",), "person") == ("statesman",)  # politician, leader: too near the root
    assert types.types(("Dallas",), "person") == ()  # the city is no kind of person


def test_a_head_word_names_the_mention_only_where_the_label_can_check_it(wordnet: WordNet) -> None:
    types = MentionTypes(wordnet)
    assert types.types(("Buffalo", "Bayou"), "body of water") == ("bayou", "stream")
    assert types.types(("Buffalo", "Bayou"), "river") == ()  # a bayou is no river
    assert types.types(("Buffalo", "Bayou"), "waterway") == ()  # a label WordNet does not know
    # a head word naming one thing gives its classes, never its own name ("lithuania" is no kind)
    assert types.types(("Republic", "of", "Lithuania"), "location") == ("geographical area",)


def test_a_renamed_name_asks_for_the_mentions_of_that_kind_only(wordnet: WordNet) -> None:
    types = MentionTypes(wordnet)
    source = Source("news", [], ("location", "person"))
    widening = Widening(renamed_share=0.0, wordnet_share=1.0, types=types, negatives={"news": ["stream", "river"]})
    both = Sentence(("Houston", "and", "Dallas"), EntitySet([Entity("location", ((0, 1),)), Entity("location", ((2, 3),))]))
    untyped = Sentence(("Houston", "and", "Texas"), EntitySet([Entity("location", ((0, 1),)), Entity("location", ((2, 3),))]))
    rng = random.Random(5)
    renamed = set()
    for _ in range(100):
        example, asked = ask(both, source, ["chemical"], rng, widening)
        assert len(set(asked)) == len(asked) and all(e.type in asked for e in example.entities)
        kinds = {e.type for e in example.entities}
        if kinds - {"location"}:
            renamed |= kinds
            assert len(example.entities) == 2  # both are cities
        example, asked = ask(untyped, source, ["chemical"], rng, widening)
        # WordNet does not know Texas: renaming would make it a false negative
        assert not {"city", "municipality", "urban area", "geographical area"} & set(asked)
        assert {e.type for e in example.entities} <= {"location"}
    assert renamed and renamed <= {"city", "municipality", "urban area", "geographical area"}


def test_a_common_noun_is_a_lowercase_word_wordnet_knows_as_a_noun_only(wordnet: WordNet) -> None:
    assert wordnet.common_noun("highways") == wordnet.common_noun("highway") == 23
    assert wordnet.common_noun("cities") == 9  # an irregular form from noun.exc
    assert wordnet.common_noun("lights") is None  # also a verb: no tagger says which
    assert wordnet.common_noun("Houston") is None and wordnet.common_noun("houston") is None  # a name
    assert wordnet.kinds(23) == ("highway", "road", "geographical area")  # region: too near the root


def test_a_common_noun_example_asks_for_kinds_of_its_nouns(wordnet: WordNet) -> None:
    types = MentionTypes(wordnet)
    kept_names = frozenset({"location"})
    # "streets" and "highway" are both roads; Houston, annotated, a municipality by WordNet; the
    # town outside every entity
    sentence = Sentence(
        ("streets", "and", "a", "highway", "near", "the", "town", "of", "Houston"),
        EntitySet([Entity("location", ((8, 9),))]),
    )
    rng = random.Random(2)
    asked_kinds: set[str] = set()
    for _ in range(60):
        example = common_noun_example(sentence, ["chemical"], rng, types, kept_names)
        assert example is not None
        found, asked = example
        asked_kinds |= set(asked) - {"chemical"}
        assert "location" not in asked  # a set's own name keeps its set's meaning
        spans = {(e.type, e.start) for e in found.entities}
        if "road" in asked:
            assert {("road", 0), ("road", 3)} <= spans
        if "municipality" in asked:
            assert {("municipality", 6), ("municipality", 8)} <= spans
        assert all(e.type in asked for e in found.entities)
    assert {"road", "highway", "street", "town", "municipality"} <= asked_kinds
    assert common_noun_example(Sentence(("Houston",), EntitySet([])), [], rng, types, kept_names) is None
