"""Sub-types of a mention's label from WordNet, so that open-label training sees thousands of type
names instead of the ~70 its sets carry: "Houston" (asked as location) is also a city, "Buffalo
Bayou" a bayou and a stream, "aspirin" (chemical) an analgesic.

Reads the noun part of the WordNet 3.0 database as Debian's `wordnet-base` installs it
(`/usr/share/wordnet`, the format of wndb(5)); nltk's reader wants a `lexnames` file that package
lacks. A mention's types are its synset's hypernyms (and, for a mention that names an instance such
as a city, the instance's classes), kept only strictly below its label's own synset, so that a
sense of the word that is not a kind of the label ("Smith" the metalworker, asked as person) adds
nothing. A label WordNet does not know, even by its last word ("miscellaneous"), takes the types
at least `MIN_DEPTH` below WordNet's root of mentions WordNet knows whole.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

DEBIAN_WORDNET = Path("/usr/share/wordnet")
MIN_DEPTH = 5  # "entity", "object", "whole", "artifact", ... say nothing a user would ask for
LEVELS = 4  # hypernym steps above a mention's synset that still make a useful type name
SENSES = 2  # the first senses of a word or label (WordNet orders them by frequency)
HYPERNYM_POINTERS = frozenset({"@", "@i"})
HAS_DIGIT = re.compile(r"\d")
# WordNet's morphy rules for nouns (wnmorph(7)): plural ending -> singular ending
NOUN_ENDINGS: tuple[tuple[str, str], ...] = (("ses", "s"), ("xes", "x"), ("zes", "z"), ("ches", "ch"), ("shes", "sh"))
NOUN_ENDINGS += (("men", "man"), ("ies", "y"), ("s", ""))


@dataclass
class WordNet:
    """Noun synsets by offset: their lemmas (first is the name used) and hypernyms."""

    lemmas: dict[int, tuple[str, ...]]
    hypernyms: dict[int, tuple[int, ...]]
    senses: dict[str, tuple[int, ...]]  # a lemma's synsets, most frequent first
    instances: frozenset[int]  # synsets that name one thing (Houston), not a kind of thing
    other_parts: frozenset[str]  # lemmas that are also verbs, adjectives or adverbs ("fly", "light")
    plurals: dict[str, str]  # WordNet's irregular noun forms (noun.exc): "aardwolves" -> "aardwolf"
    _depth: dict[int, int] = field(default_factory=dict, repr=False)

    @classmethod
    def load(cls, folder: Path = DEBIAN_WORDNET) -> WordNet:
        if not (folder / "data.noun").is_file():
            raise FileNotFoundError(f"no WordNet noun database in {folder}: apt-get install wordnet-base")
        lemmas: dict[int, tuple[str, ...]] = {}
        hypernyms: dict[int, tuple[int, ...]] = {}
        instances: set[int] = set()
        for line in (folder / "data.noun").read_text(encoding="utf-8").splitlines():
            if line.startswith(" "):  # the licence header
                continue
            fields = line.split("|", 1)[0].split()
            offset, count = int(fields[0]), int(fields[3], 16)
            words = [fields[4 + 2 * i].rsplit("(", 1)[0].lower() for i in range(count)]
            at = 4 + 2 * count
            pointers = int(fields[at])
            links = [fields[at + 1 + 4 * i : at + 5 + 4 * i] for i in range(pointers)]
            lemmas[offset] = tuple(words)
            hypernyms[offset] = tuple(int(p[1]) for p in links if p[0] in HYPERNYM_POINTERS and p[2] == "n")
            if any(p[0] == "@i" for p in links):
                instances.add(offset)
        senses: dict[str, tuple[int, ...]] = {}
        for line in (folder / "index.noun").read_text(encoding="utf-8").splitlines():
            if line.startswith(" "):
                continue
            fields = line.split()
            synsets = int(fields[2])
            senses[fields[0]] = tuple(int(x) for x in fields[-synsets:])
        other_parts = frozenset(
            line.split(" ", 1)[0]
            for part in ("verb", "adj", "adv")
            for line in (folder / f"index.{part}").read_text(encoding="utf-8").splitlines()
            if not line.startswith(" ")
        )
        exceptions = (folder / "noun.exc").read_text(encoding="utf-8").split("\n")
        plurals = {f[0]: f[1] for f in (line.split() for line in exceptions) if len(f) >= 2}
        return cls(lemmas, hypernyms, senses, frozenset(instances), other_parts, plurals)

    def depth(self, synset: int) -> int:
        """Fewest hypernym steps to the root."""
        if synset not in self._depth:
            above = self.hypernyms[synset]
            self._depth[synset] = 0 if not above else 1 + min(self.depth(h) for h in above)
        return self._depth[synset]

    def lookup(self, words: Iterable[str]) -> tuple[int, ...]:
        return self.senses.get("_".join(w.lower() for w in words), ())

    def ancestors(self, synset: int) -> list[list[int]]:
        """Hypernyms by level above `synset` (level 1 first), up to the root."""
        levels, frontier, seen = [], [synset], {synset}
        while frontier:
            frontier = [h for s in frontier for h in self.hypernyms[s] if h not in seen]
            seen.update(frontier)
            if frontier:
                levels.append(frontier)
        return levels

    def name(self, synset: int) -> str:
        return self.lemmas[synset][0].replace("_", " ")

    def common_noun(self, word: str) -> int | None:
        """The first sense of a lowercase word that WordNet knows as a noun only (so that "fly" or
        "light" never count, and no tagger is needed), singular by WordNet's own noun rules."""
        if len(word) < 3 or not word.isalpha() or not word.islower():
            return None
        bases = [self.plurals[word]] if word in self.plurals else [word]
        bases += [word[: -len(end)] + base for end, base in NOUN_ENDINGS if word.endswith(end)]
        for base in bases:
            if base in self.senses:
                synset = self.senses[base][0]
                return None if base in self.other_parts or synset in self.instances else synset
        return None

    def specific_names(self, levels: list[list[int]]) -> list[str]:
        """The names of the synsets deep enough to be specific, level by level."""
        return [self.name(s) for level in levels for s in level if self.depth(s) >= MIN_DEPTH]

    def kinds(self, synset: int) -> tuple[str, ...]:
        """The synset's own name and its hypernyms' up to LEVELS above, those deep enough to be specific."""
        return tuple(dict.fromkeys(self.specific_names([[synset], *self.ancestors(synset)][: LEVELS + 1])))


@dataclass
class MentionTypes:
    """Type names for a mention asked under a label (cached: mentions repeat across a corpus)."""

    wordnet: WordNet

    def __post_init__(self) -> None:
        self.types = lru_cache(maxsize=None)(self._types)

    def _types(self, words: tuple[str, ...], label: str) -> tuple[str, ...]:
        label_words = label.lower().split()
        label_synsets = set(self.wordnet.lookup(label_words)[:SENSES] or self.wordnet.lookup(label_words[-1:])[:SENSES])
        # the mention as a whole names the synset (aspirin, Houston): its own name would only teach
        # string matching; a head word (the bayou of "Buffalo Bayou") names the mention's kind, but
        # only where the label can check it ("Jurassic Park" is no park)
        candidates = [(s, False) for s in self.wordnet.lookup(words)[:SENSES]]
        if not candidates and label_synsets:
            candidates = [(s, True) for s in self.wordnet.lookup(words[-1:])[:SENSES]]
        for synset, own_name in candidates:  # the first sense that is a kind of the label
            own_name = own_name and synset not in self.wordnet.instances  # "Lithuania" is no kind of thing
            chain = [[synset], *self.wordnet.ancestors(synset)] if own_name else self.wordnet.ancestors(synset)
            names = [n for n in self._below_label(chain, label_synsets) if n != label.lower() and not HAS_DIGIT.search(n)]
            if names:
                return tuple(dict.fromkeys(names))
        return ()

    def _below_label(self, chain: list[list[int]], label_synsets: set[int]) -> list[str]:
        """The chain's names strictly below the label's synset (all of them when the label is not in
        WordNet, those deep enough to be specific); nothing when the chain never reaches the label."""
        if label_synsets:
            reached = next((i for i, level in enumerate(chain) if label_synsets & set(level)), None)
            if reached is None:
                return []
            chain = chain[:reached]
        return self.wordnet.specific_names(chain[:LEVELS])
