"""Constrained decoding for GNER (numpy): a row may write only its sentence's next word (its
sub-words, forced), "(", one tag of the request's label list (a choice over a token trie), ")",
and the end after the last word. Generation then cannot drop, add or alter words, and every
choice the model makes is a tag.

The state of a row is a function of its history; it is kept in a table keyed by the history's
bytes, each new state derived from its prefix's, so beam search may reorder rows freely.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from nerserve.ner.archs.gner.tagging import Markers

Trie = dict[int, "TrieNode"]


@dataclass
class TrieNode:
    children: Trie = field(default_factory=dict)
    terminal: bool = False


def trie_of(sequences: Sequence[Sequence[int]]) -> TrieNode:
    root = TrieNode()
    for sequence in sequences:
        node = root
        for token in sequence:
            node = node.children.setdefault(token, TrieNode())
        node.terminal = True
    return root


@dataclass(frozen=True)
class Forced:
    """Writing the fixed tokens `tokens[k:]`, then the tag of word `word` (or the end if none is left)."""

    word: int
    tokens: tuple[int, ...]
    k: int


@dataclass(frozen=True)
class Choosing:
    """Inside the tag of word `word`, at a trie node."""

    word: int
    node: TrieNode


State = Forced | Choosing


@dataclass
class SentenceGrammar:
    """One sentence's constrained format: its words' sub-words and the tags of its label list."""

    pieces: Sequence[Sequence[int]]
    tags: TrieNode
    markers: Markers

    def segment(self, word: int) -> tuple[int, ...]:
        """The forced tokens before word `word`'s tag: ")" of the previous tag, its sub-words, "("."""
        close = self.markers.close if word > 0 else ()
        if word == len(self.pieces):
            return (*close, self.markers.end)
        return (*close, *self.pieces[word], *self.markers.open)

    def first(self) -> State:
        return Forced(0, self.segment(0), 0)

    def allowed(self, state: State) -> list[int]:
        if isinstance(state, Forced):
            return [state.tokens[state.k]] if state.k < len(state.tokens) else [self.markers.end]
        allowed = list(state.node.children)
        if state.node.terminal:
            allowed.append(self.segment(state.word + 1)[0])
        return allowed

    def advance(self, state: State, token: int) -> State:
        if isinstance(state, Forced):
            if state.k + 1 < len(state.tokens):
                return Forced(state.word, state.tokens, state.k + 1)
            if state.word == len(self.pieces):
                return Forced(state.word, state.tokens, len(state.tokens))  # done: the end again
            return Choosing(state.word, self.tags)
        child = state.node.children.get(token)
        if child is not None:
            return Choosing(state.word, child)
        following = self.segment(state.word + 1)  # the tag ended: its ")" was written
        return Forced(state.word + 1, following, 1)

    def steps(self, longest_tag: int) -> int:
        """Tokens the row writes at most (the end included)."""
        return sum(len(self.segment(w)) + longest_tag for w in range(len(self.pieces))) + len(self.segment(len(self.pieces)))


class Constraint:
    """The Loop's constraint (generation.Candidates) for rows that belong to
    `grammars[row_sentence[row]]`."""

    def __init__(self, grammars: Sequence[SentenceGrammar], row_sentence: np.ndarray) -> None:
        self.grammars = grammars
        self.row_sentence = row_sentence
        self.states: dict[tuple[int, bytes], State] = {}

    def state(self, row: int, history: np.ndarray) -> State:
        sentence = int(self.row_sentence[row])
        key = (sentence, history.tobytes())
        known = self.states.get(key)
        if known is None:
            grammar = self.grammars[sentence]
            first = len(history) == 1
            known = grammar.first() if first else grammar.advance(self.state(row, history[:-1]), int(history[-1]))
            self.states[key] = known
        return known

    def select(self, rows: np.ndarray) -> Constraint:
        """The constraint of `rows` alone, sharing what the grammars' states are known to be."""
        narrowed = Constraint(self.grammars, self.row_sentence[rows])
        narrowed.states = self.states
        return narrowed

    def candidates(self, history: np.ndarray) -> list[list[int]]:
        """The tokens each row may write next (a step then scores only these)."""
        return [self.grammars[self.row_sentence[row]].allowed(self.state(row, history[row])) for row in range(len(history))]
