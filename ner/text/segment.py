"""Raw text → sentences of words with character offsets (Unicode code points, end excluded).

Rule-based on purpose: it is fast, deterministic, and its offsets are exact by construction
(every word is a regex match on the caller's string). The tokenisation follows the style of the
training data (punctuation split off, abbreviations such as "U.S." and hyphenated words kept).
"""

from __future__ import annotations

import re

from nerserve.ner.types import Word

# Abbreviations written with one final period, kept whole as the training data keeps them
# ("Mr.", "St. Louis", "Corp."), so a period after them neither splits the word nor the sentence.
ABBREVIATIONS = [
    "Mr",
    "Mrs",
    "Ms",
    "Dr",
    "Prof",
    "St",
    "Mt",
    "Ft",
    "Gen",
    "Gov",
    "Sen",
    "Rep",
    "Rev",
    "Col",
    "Capt",
    "Lt",
    "Sgt",
    "Maj",
    "Adm",
    "Jr",
    "Sr",
    "Corp",
    "Inc",
    "Ltd",
    "Co",
    "Bros",
    "Dept",
    "Univ",
    "Jan",
    "Feb",
    "Mar",
    "Apr",
    "Jun",
    "Jul",
    "Aug",
    "Sep",
    "Sept",
    "Oct",
    "Nov",
    "Dec",
    "No",
    "Nos",
    "Vol",
    "vs",
    "etc",
    "Ave",
    "Blvd",
    "Rd",
    "Calif",
    "Fla",
    "Ill",
    "Mass",
    "Mich",
    "Minn",
    "Penn",
    "Va",
    "Wash",
]
_WORD = re.compile(
    r"""
    (?:[A-Za-z]\.){2,}            # abbreviations: U.S. e.g.
    | \b(?:"""
    + "|".join(ABBREVIATIONS)
    + r""")\.                      # titles, months, company suffixes: Mr. St. Jan. Corp.
    | \b[A-Z]\.(?=\s+[A-Z])       # an initial before a name: J. Smith
    | \d+(?:[.,:/]\d+)*           # numbers: 3.5 1,000 10:30 1/2
    | \w+(?:[-'’]\w+)*            # words, with inner hyphens and apostrophes
    | [^\w\s]                     # any other symbol on its own
    """,
    re.VERBOSE,
)
_SENTENCE_END = {".", "!", "?"}
_CLOSERS = {'"', "'", ")", "]", "”", "’"}


def words_of(text: str) -> list[Word]:
    return [Word(m.group(), m.start(), m.end()) for m in _WORD.finditer(text)]


def split_sentences(text: str) -> list[list[Word]]:
    """Words grouped into sentences: a sentence ends after . ! ? (and closing quotes/brackets)
    when the next word starts with an upper-case letter, a digit or a quote after whitespace."""
    words = words_of(text)
    sentences: list[list[Word]] = []
    current: list[Word] = []
    for index, word in enumerate(words):
        current.append(word)
        if word.text not in _SENTENCE_END and not (
            word.text in _CLOSERS and len(current) > 1 and current[-2].text in _SENTENCE_END
        ):
            continue
        following = words[index + 1] if index + 1 < len(words) else None
        if following is None:
            continue
        if following.text in _CLOSERS and following.start == word.end:
            continue  # the closing quote belongs to this sentence
        gap = text[word.end : following.start]
        if (
            gap
            and gap.isspace()
            and (following.text[0].isupper() or following.text[0].isdigit() or following.text[0] in "\"“'(")
        ):
            sentences.append(current)
            current = []
    if current:
        sentences.append(current)
    return sentences


def words_of_tokens(tokens: list[str]) -> tuple[str, list[Word]]:
    """Pre-tokenised input: the text is the tokens joined by single spaces (the API's convention)."""
    words: list[Word] = []
    position = 0
    for token in tokens:
        words.append(Word(token, position, position + len(token)))
        position += len(token) + 1
    return " ".join(tokens), words
