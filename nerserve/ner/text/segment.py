"""Raw text → sentences of words with character offsets (Unicode code points, end excluded).

Rule-based on purpose: it is fast, deterministic, and its offsets are exact by construction
(every word is a regex match on the caller's string). The tokenisation follows the style of the
training data (punctuation split off, abbreviations such as "U.S." and hyphenated words kept).
"""

from __future__ import annotations

import functools
import itertools
import operator
import re

from nerserve.ner.types import Word

# Abbreviations written with one final period, kept whole as the training data keeps them
# ("Mr.", "St. Louis", "Corp."), so a period after them neither splits the word nor the sentence.
# Titles and months stand before what they name; the others can end a sentence, and there the
# training data writes the sentence's period apart ("… and Lear Corp ." / "Kansas City , Mo .").
TITLES = ["Mr", "Mrs", "Ms", "Dr", "Prof", "St", "Mt", "Ft", "Gen", "Gov", "Sen", "Rep", "Rev", "Col", "Capt"]
TITLES += ["Lt", "Sgt", "Maj", "Adm", "No", "Nos", "Vol", "vs"]
TITLES += ["Jan", "Feb", "Mar", "Apr", "Jun", "Jul", "Aug", "Sep", "Sept", "Oct", "Nov", "Dec"]
SUFFIXES = ["Jr", "Sr", "Corp", "Inc", "Ltd", "Co", "Bros", "Dept", "Univ", "etc", "Ave", "Blvd", "Rd"]
SUFFIXES += ["Calif", "Fla", "Ill", "Mass", "Mich", "Minn", "Penn", "Va", "Wash", "Mo"]


def _alternatives(names: list[str]) -> str:
    return "|".join(names + [name.upper() for name in names if not name.isupper()])  # "ST. LOUIS" in a headline


def _abbreviations(names: list[str]) -> str:
    """NAMES (or their upper case), each followed by a period, behind a lookahead on that shape: the
    regex engine tries a long alternation one name at a time, and the lookahead fails at once
    where most words are (too long, or no period after them)."""
    shortest, longest = min(map(len, names)), max(map(len, names))
    return rf"(?=[A-Za-z]{{{shortest},{longest}}}\.)(?:{_alternatives(names)})\."


_WORD = re.compile(
    r"""
    (?:[A-Za-z]\.){2,}(?:-\w+)*   # abbreviations: U.S. e.g. U.S.-led
    | \b"""
    + _abbreviations(TITLES)
    + r"""                        # titles and months: Mr. St. Jan.
    | \b"""
    + _abbreviations(SUFFIXES)
    + r"""(?!\s*(?:$|[\n\r"”.]))      # company suffixes, states: Corp. Fla., unless they end the sentence
    | \b[A-Z]\.(?=\s+[A-Z])       # an initial before a name: J. Smith
    | \b[A-Z]{1,2}\$              # currencies: C$ A$ US$ HK$
    | \d+(?:[-.,:/]\d+)*          # numbers: 3.5 1,000 10:30 1/2, dates and scores: 1996-08-30 4-38
    | \w+(?:[-'’]\w+)*            # words, with inner hyphens and apostrophes
    | [^\w\s]                     # any other symbol on its own
    """,
    re.VERBOSE,
)
_SENTENCE_END = {".", "!", "?"}
_CLOSERS = {'"', "'", ")", "]", "”", "’"}


# Clitics written apart, as the training data (Penn Treebank style) writes them: "Russia 's",
# "does n't", "they 're". Kept on, a possessive hid the entity ("Russia's" is no location).
_CLITIC = re.compile(r"(?:n[’']t|[’'](?:s|re|ve|ll|m|d))$", re.IGNORECASE)


def _split_clitic(word: Word) -> list[Word]:
    match = _CLITIC.search(word.text)
    if match is None or match.start() == 0:
        return [word]
    cut = word.start + match.start()
    return [Word(word.text[: match.start()], word.start, cut), Word(match.group(), cut, word.end)]


# A Word made from its (text, start, end) in C: a named tuple's own constructor is a Python function,
# and every request makes one a word.
_word = functools.partial(tuple.__new__, Word)


def words_of(text: str) -> list[Word]:
    words = [_word((match.group(), match.start(), match.end())) for match in _WORD.finditer(text)]
    if "'" not in text and "’" not in text:  # every clitic has an apostrophe: most texts skip the search
        return words
    return [part for word in words for part in (_split_clitic(word) if "'" in word.text or "’" in word.text else (word,))]


# A line that ends in one of these goes on in the next line (hard-wrapped prose), whatever follows.
_CONTINUES = {",", "-", "–", "—", "(", "[", "/", "&", "+"}


def _starts_sentence(word: Word) -> bool:
    return word.text[0].isupper() or word.text[0].isdigit() or word.text[0] in "\"“'("


def _ends_sentence(current: list[Word]) -> bool:
    """After . ! ? (or a closing quote/bracket right after one)."""
    last = current[-1].text
    return last in _SENTENCE_END or (last in _CLOSERS and len(current) > 1 and current[-2].text in _SENTENCE_END)


def _paragraph_break(gap: str) -> bool:
    return gap.count("\n") > 1 or gap.count("\r") > 1


SHORT_LINE = 40  # characters: bylines and short headlines; wrapped prose runs longer


def _ends_line_unit(text: str, current: list[Word], gap: str) -> bool:
    """A line break after a line that does not read as wrapped prose: headlines, bylines, datelines,
    list and table rows ("LONDON 1996-08-30", "Nadim Ladki", "Japan 2 Syria 1") end without a
    period, and the next line starts a new unit. A line that ends in a lower-case word or a joining
    symbol ("… said on" / "Thursday …") is wrapped prose; one that ends in a capitalised word is a
    unit only when it is short or has no lower case (a long line ending "… the European" /
    "Commission …" is wrapped), counted from where the sentence began if that is on the line."""
    if "\n" not in gap and "\r" not in gap:
        return False
    word = current[-1]
    last = word.text
    if last[0].islower() or last in _CONTINUES:
        return False
    if not last[0].isalpha():
        return True  # a number, a date, a closing bracket, a colon
    # the line from its start, or from where this sentence began on it ("… town. Yuri Kushko")
    line_start = max(text.rfind("\n", 0, word.start), text.rfind("\r", 0, word.start)) + 1
    line = text[max(line_start, current[0].start) : word.end]
    return len(line) <= SHORT_LINE or not any(c.islower() for c in line)


def split_sentences(text: str) -> list[list[Word]]:
    """Words grouped into sentences: at a blank line; and after . ! ? (and closing quotes or
    brackets) or at the end of a line unit (see _ends_line_unit) when the next word starts with an
    upper-case letter, a digit, a quote or a bracket."""
    words = words_of(text)
    sentences: list[list[Word]] = []
    current: list[Word] = []
    followers: list[Word | None] = [*words[1:], None] if words else []
    for word, following in zip(words, followers, strict=True):
        current.append(word)
        if following is None:
            break
        gap = text[word.end : following.start]
        if not gap:
            continue  # attached: a closing quote, "3.5", "U.S.-based"
        if gap == " ":  # nearly every gap: no line in it ends, so only . ! ? end a sentence
            if _ends_sentence(current) and _starts_sentence(following):
                sentences.append(current)
                current = []
            continue
        if _paragraph_break(gap) or (
            _starts_sentence(following) and (_ends_sentence(current) or _ends_line_unit(text, current, gap))
        ):
            sentences.append(current)
            current = []
    if current:
        sentences.append(current)
    return sentences


def words_of_tokens(tokens: list[str]) -> tuple[str, list[Word]]:
    """Pre-tokenised input: the text is the tokens joined by single spaces (the API's convention)."""
    lengths = list(map(len, tokens))
    starts = list(itertools.accumulate(map((1).__add__, lengths[:-1]), initial=0))
    ends = map(operator.add, starts, lengths)
    # not strict: with no tokens, `starts` still holds one 0
    return " ".join(tokens), list(map(_word, zip(tokens, starts, ends, strict=False)))
