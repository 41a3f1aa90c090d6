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
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterable, Sequence

from pydantic import BaseModel, ConfigDict

from nerserve.ner.types import Word

# Abbreviations written with one final period, kept whole as the training data keeps them
# ("Mr.", "St. Louis", "Corp."), so a period after them neither splits the word nor the sentence.
# Titles and months stand before what they name; the others can end a sentence, and there the
# training data writes the sentence's period apart ("… and Lear Corp ." / "Kansas City , Mo .").
TITLES = ["Mr", "Mrs", "Ms", "Dr", "Prof", "St", "Mt", "Ft", "Gen", "Gov", "Sen", "Rep", "Rev", "Col", "Capt"]
TITLES += ["Lt", "Sgt", "Maj", "Adm", "No", "Nos", "Vol", "vs"]
# and what papers write before a citation's year, a figure's or an equation's number: "Smith et al.
# (1990)", "Fig. 2", "Eq. 3", "approx. 5 mg", "cf. Table 1" (GENIA writes "al." as one token)
TITLES += ["al", "Fig", "Figs", "Eq", "Eqs", "Ref", "Refs", "approx", "cf"]
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


def _characters(wanted: Callable[[str], bool]) -> str:
    """A character-class body of the characters WANTED picks, as runs of code points. Every combining
    mark and format character lies in the first two planes or in plane 14 (tags, variation selectors)."""
    codes = [c for block in (range(0x20000), range(0xE0000, 0xE1000)) for c in block if wanted(chr(c))]
    runs: list[list[int]] = []
    for code in codes:
        if runs and runs[-1][1] == code - 1:
            runs[-1][1] = code
        else:
            runs.append([code, code])
    return "".join(f"\\U{first:08x}-\\U{last:08x}" for first, last in runs)


def _is_format(char: str) -> bool:
    """An invisible format character that does not break a word (a soft hyphen from HTML's &shy;,
    a zero-width joiner or non-joiner, a word joiner); a zero-width space marks a word's end."""
    return unicodedata.category(char) == "Cf" and char != "\u200b"


def _is_mark(char: str) -> bool:
    return unicodedata.category(char)[0] == "M"


# What Unicode's word boundaries (UAX #29, rule WB4) keep with the character before them, and `re`'s
# \w leaves out: combining marks (the accent of a decomposed "é", e + U+0301, as macOS file names and
# some PDF text write it; Devanagari's and Thai's vowel signs) and format characters.
_MARKS = _characters(_is_mark)
_FORMATS = _characters(_is_format)
_JOINING = _MARKS + _FORMATS  # one class body of both's ranges
_FORMAT = re.compile(f"[{_FORMATS}]")
_TRAILING_FORMAT = re.compile(f"[{_FORMATS}]+$")


def is_invisible(char: str) -> bool:
    """A control or format character: no word, and never at a word's edge."""
    return unicodedata.category(char) in ("Cc", "Cf")


# Invisible characters outside a word are no word of their own, as spaces are not: a byte-order mark
# at a file's start, a zero-width space, the bidirectional marks and isolates around a name in
# mixed-script text (tweets carry them), a stray control character. Read as words, each was an
# unknown sub-word inside the sentence, or inside an entity's offsets.
_INVISIBLE = _characters(is_invisible)
# between two words, such characters and no space leave them attached ("M.<ZWSP>O.<ZWSP>D.")
_INVISIBLE_GAP = re.compile(f"(?:(?!\\s)[{_INVISIBLE}])+")

# a word: word characters and what joins them (which never starts a word, and ends it only as the
# marks of its last letter, so that an invisible character after a word stays outside its offsets);
# most words end at a space, which the lookahead turns away before the joining characters' long class
# (tried at every word's end, that class cost a fifth of the words' match time). Underscores join
# inside a word ("snake_case") but are symbols at its edges, as markdown's emphasis ("_Macron_") uses them.
# Han ideographs and hiragana are a word each, as Unicode's word boundaries have them (UAX #29 joins
# neither): written without spaces, a Chinese or Japanese text was one word, clipped to a window's
# sub-words, and everything after its first few hundred characters went unread.
_IDEOGRAPHS = "\u3040-\u309f\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003134f"
_LETTERS = rf"(?!_)[^\W{_IDEOGRAPHS}]+(?<!_)"
_WORD_RUN = rf"{_LETTERS}(?:(?=[^\s\w])(?:[{_JOINING}]+{_LETTERS}|[{_MARKS}]+))*"

# Every line boundary str.splitlines knows ("\r\n" one of them), as a character class's escapes:
# besides \n and \r, the form feed between pdftotext's pages, the vertical tab, NEL, and Unicode's
# line and paragraph separators (U+2028, U+2029) that word processors write.
_LINE_BREAKS = r"\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"


class WordStyle(BaseModel):
    """What corpora write differently, as a model's training data writes it, so that raw text is cut
    into the words the model learnt from: GENIA writes "p50/p65", "1,25(OH)2D3" and "5'-flanking" as
    one token each, CoNLL-2003 "US / UK" as three and no word with a bracket inside; GENIA cuts
    "-induced" off "IL-2-induced" (where the stem is an entity, which a text alone cannot tell). Read
    off the training data (`written_in`) into the model's manifest; the default is the plain style."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    slashes: bool = False  # "p50/p65", "and/or", "ng/ml": one word
    brackets: bool = False  # "1,25(OH)2D3", "CD4(+)", "Ca(2+)", "[3H]thymidine": one word
    primes: bool = False  # "5'", "5'-flanking", "3'-UTR": a number's prime stays on it
    suffixes: tuple[str, ...] = ()  # "induced": "IL-2-induced" is "IL-2" and "-induced"
    # "J. Smith": a capital and its period are one word, an initial, before a capitalised word.
    # GENIA writes no names so but ends many a sentence on a capital ("… of NF-kappa B . We show"):
    # there the period is the sentence's, and the next word starts another.
    initials: bool = True

    @classmethod
    def written_in(cls, sentences: Iterable[Sequence[str]]) -> WordStyle:
        """The style of a corpus's token lists: a form is joined where the corpus writes it whole
        more often than apart, and at least once in a thousand sentences; a hyphen's suffix is cut
        off where it is a token of its own ("-induced") more often than the end of one ("ligand-induced"),
        and at least once in a thousand sentences. (A bracket written apart cannot be told from one
        that stood apart in the text, so brackets go by the first count.) Initials are not one word
        where the corpus ends more sentences on a lone capital and its period than it writes a
        capital with its period before a capitalised word, and at least once in a thousand sentences."""
        whole = {"slashes": 0, "brackets": 0, "primes": 0}
        apart = dict.fromkeys(whole, 0)
        suffix_apart: Counter[str] = Counter()
        suffix_whole: Counter[str] = Counter()
        initials = capitals_ending = count = 0
        for tokens in sentences:
            count += 1
            if len(tokens) > 1 and tokens[-1] == "." and _CAPITAL.fullmatch(tokens[-2]):
                capitals_ending += 1
            for i, token in enumerate(tokens):
                if _INITIAL.fullmatch(token) and i + 1 < len(tokens) and tokens[i + 1][:1].isupper():
                    initials += 1
                if "-" in token and (suffix := _SUFFIX.search(token)):
                    (suffix_apart if suffix.start() == 0 and i > 0 else suffix_whole)[suffix.group(1)] += 1
                whole["slashes"] += bool(_SLASHED.fullmatch(token)) and "://" not in token
                whole["brackets"] += bool(_BRACKETED_TOKEN.search(token))
                whole["primes"] += bool(_PRIMED.fullmatch(token))
                if 0 < i < len(tokens) - 1 and token in ("/", "'"):
                    before, after = tokens[i - 1], tokens[i + 1]
                    if token == "/" and before[-1].isalpha() and after[0].isalpha():
                        apart["slashes"] += 1
                    elif token == "'" and before.isdigit():
                        apart["primes"] += 1
        joined = {form: whole[form] > apart[form] and whole[form] * 1000 >= count for form in whole}
        cut = (s for s, n in suffix_apart.items() if n > suffix_whole[s] and n * 1000 >= count)
        sentences_end_on_capitals = capitals_ending > initials and capitals_ending * 1000 >= count
        return cls(**joined, suffixes=tuple(sorted(cut)), initials=not sentences_end_on_capitals)


PLAIN_WORDS = WordStyle()

# the forms WordStyle.written_in counts in a corpus's tokens
_SLASHED = re.compile(r"\S*[^\W\d_]\w*/\w*[^\W\d_]\S*")
# a bracket with what a word with brackets inside has on its outer side (a word character, or a plus
# sign before it: "CD4+(x)"); written to start at the bracket, which the regex engine finds by its
# character class alone (five times faster over a text than starting at the word character)
_BRACKETED_TOKEN = re.compile(r"[][()](?:(?<=[\w+][(\[])|(?<=[)\]])(?=\w))")
_PRIMED = re.compile(r"\d+'\S*")
_SUFFIX = re.compile(r"(?:^|(?<=\w))-([^\W\d_]+)$")  # "-induced", or the end of "ligand-induced"
_INITIAL = re.compile(r"[A-Z]\.")
_CAPITAL = re.compile(r"[A-Z]")


def _bracketed(no_suffix: str) -> str:
    """A word with brackets inside, in the brackets style: a stem and bracketed groups ("1,25(OH)2D3",
    "CD4(+)", "p56(lck)"), or a group before letters ("[3H]thymidine"); what follows a group goes on
    only while word characters do, so a sentence's period stays apart, and not into a suffix cut off."""
    after_group = rf"(?:[\w+]|{no_suffix}[-.](?=\w))*"
    group = rf"[(\[][\w,.+;:-]+[)\]]{after_group}"
    return rf"\w(?:[\w+]|[-.,](?=\w))*(?:{group})+ | [(\[][\w,.+;:-]+[)\]]\w{after_group}"


# an initial before a name ("J. Smith"); in a style whose sentences end on capitals, only where
# names are listed, as a citation's authors are: after a bracket, a comma, "and" or another initial
# ("(S. Miyatake, M. Seiki, and K. Arai", "Hinrichs, S. H., Reynolds")
_INITIAL_WORD = rf"\b[A-Z]\.(?=[\s{_INVISIBLE}]+[A-Z]) | "
_LISTED_INITIAL = rf"(?:(?<=\()|(?<=[(,]\s)|(?<=\band\s)|(?<=\b[A-Z]\.\s))[A-Z]\.(?=[\s{_INVISIBLE}]+[A-Z]) | "


def _words(before_plain_words: str = "", style: WordStyle = PLAIN_WORDS, brackets: bool = False) -> str:
    """The pattern of a word in STYLE, with BEFORE_PLAIN_WORDS (alternatives) tried before the plain
    words'; BRACKETS: with words that have brackets inside (the style's, for a text that holds one)."""
    joiners = "-'’/" if style.slashes else "-'’"
    prime = "(?:'(?=[\\s\\w-]))?" if style.primes else ""
    suffixes = "|".join(map(re.escape, style.suffixes))
    # a hyphen that does not join its suffix on, and the suffix as a word of its own
    no_suffix = rf"(?!-(?:{suffixes})(?!\w))" if suffixes else ""
    suffix = rf"-(?:{suffixes})(?!\w) | " if suffixes else ""
    bracketed = f"{_bracketed(no_suffix)}\n        | " if brackets else ""
    return (
        r"""
        (?:[A-Za-z]\.){2,}(?:-\w+)*   # abbreviations: U.S. e.g. U.S.-led
        | \b"""
        + _abbreviations(TITLES)
        + r"""                        # titles and months: Mr. St. Jan.
        | \b"""
        + _abbreviations(SUFFIXES)
        + r"""(?!\s*(?:$|[\n\r"”.]))      # company suffixes, states: Corp. Fla., unless they end the sentence
        | """
        + (_INITIAL_WORD if style.initials else _LISTED_INITIAL)  # an initial before a name: J. Smith
        + r"""\b[A-Z]{1,2}\$              # currencies: C$ A$ US$ HK$
        | (?<![^"""
        + _LINE_BREAKS
        + r"""])\d{1,3}\.(?=[ \t])  # a list's number at a line's start: "1. Michael Johnson ( U.S. ) 19.32"
        | """
        + bracketed
        + rf"\d+(?:[-.,:/]\d+)*{prime}\w*(?:{no_suffix}[{joiners}]\w+)*"
        + r"""  # numbers: 3.5 1,000 10:30 1/2, dates and scores: 1996-08-30 4-38,
                                      # with what the data writes on them: 1st 1990s 50-kDa 2.5-fold 10-year-old
        | """
        + before_plain_words
        + rf"{_WORD_RUN}(?:(?=[^\s\w])[{_JOINING}]*{no_suffix}[{joiners}]{_WORD_RUN})*(?:\++(?!\w))?"
        + r"""  # words, with inner hyphens and apostrophes, and the plus signs
        # written on them: CD4+ T cells, Ca2+, AA+ (a rating), C++
        | """
        + suffix
        + r"""-{2,} | \.{3,} | \+/-          # a dash written "--", an ellipsis "...", plus or minus
        | _+                          # underscores at a word's edges
        | ["""
        + _IDEOGRAPHS
        + r"""]  # an ideograph
        | [^\w\s"""
        + _INVISIBLE
        + r"""]  # any other visible symbol on its own
        """
    )


# Links, each one word as the tweets of the training data write them ("http://t.co/QLOb9A8yp1"),
# rather than a dozen words of letters and symbols the model would read as names: a URL from its
# scheme or "www." to its last character that is not closing punctuation; an e-mail address. Only
# a text that may hold one is read with them: trying them at every word would cost every text.
_LINKS = r"""
    (?:[A-Za-z][A-Za-z0-9+.-]*://|www\.|WWW\.)[^\s<>"]*[^\s<>".,;:!?)\]}'’”]   # URLs
    | [\w.+-]+@[\w-]+(?:\.[\w-]+)+                                      # e-mail addresses
    |"""
# a user name after its "@" (a space between, as some text writes it), underscores and all: "@akshayy_"
_USER_NAME = r"""(?:(?<=@)|(?<=@\ ))\w+(?:[-'’]\w+)*
        | """


@functools.cache
def _word_pattern(style: WordStyle, links: bool, brackets: bool) -> re.Pattern[str]:
    """The words of STYLE; with LINKS, links and user names too; with BRACKETS, words with brackets inside."""
    if links:
        return re.compile(_LINKS + _words(_USER_NAME, style, brackets), re.VERBOSE)
    return re.compile(_words(style=style, brackets=brackets), re.VERBOSE)


_WORD = _word_pattern(PLAIN_WORDS, links=False, brackets=False)


def _may_hold_links(text: str) -> bool:
    return "://" in text or "@" in text or "www." in text or "WWW." in text


def _is_link(word: str) -> bool:
    return len(word) > 1 and _may_hold_links(word)  # a lone "@" is a symbol; any longer word with one, a link


_SENTENCE_END = {".", "!", "?", "...", "…"}  # an ellipsis too: most of the data's end their sentence
_CLOSERS = {'"', "'", ")", "]", "”", "’"}


# Clitics written apart, as the training data (Penn Treebank style) writes them: "Russia 's",
# "does n't", "they 're". Kept on, a possessive hid the entity ("Russia's" is no location).
_CLITIC = re.compile(r"(?:n[’']t|[’'](?:s|re|ve|ll|m|d))$", re.IGNORECASE)


def _split_clitic(word: Word) -> list[Word]:
    match = _CLITIC.search(word.text)
    if match is None or match.start() == 0:
        return [word]
    cut = word.start + match.start()
    # "Merkel" + U+2069 + "'s": the invisible character between stays outside both words
    stem = _TRAILING_FORMAT.sub("", word.text[: match.start()])
    return [Word(stem, word.start, word.start + len(stem)), Word(match.group(), cut, word.end)]


# A Word made from its (text, start, end) in C: a named tuple's own constructor is a Python function,
# and every request makes one a word.
_word = functools.partial(tuple.__new__, Word)


def words_of(text: str, style: WordStyle = PLAIN_WORDS) -> list[Word]:
    # words with brackets inside are tried only in a text that has one: trying them costs every word
    brackets = style.brackets and _BRACKETED_TOKEN.search(text) is not None
    pattern = _word_pattern(style, _may_hold_links(text), brackets)
    words = [_word((match.group(), match.start(), match.end())) for match in pattern.finditer(text)]
    if "'" not in text and "’" not in text:  # every clitic has an apostrophe: most texts skip the search
        return words
    return [part for word in words for part in (_split_clitic(word) if "'" in word.text or "’" in word.text else (word,))]


# A line that ends in one of these goes on in the next line (hard-wrapped prose), whatever follows.
_CONTINUES = {",", "-", "–", "—", "(", "[", "/", "&", "+"}


# A name written in lower case at its start, as biomedical text starts many a sentence ("c-myc",
# "v-Fos", "cDNA", "mRNA", "p50", "cAMP"): a capital or digit after its first letters, or one letter
# and a hyphen. A plain lower-case word after a period goes on the sentence ("approx. five").
_LOWER_CASE_NAME = re.compile(r"[a-z]+[A-Z0-9]|[a-z]-\w")


def _starts_sentence(word: Word) -> bool:
    first = word.text[0]
    return (
        first.isupper()
        or first.isdigit()
        or first in "\"“'(["  # a quote, or a bracket: GENIA's titles are written "[Effects of …]"
        or (first.islower() and _LOWER_CASE_NAME.match(word.text) is not None)
    )


def _ends_sentence(current: list[Word]) -> bool:
    """After . ! ? (or a closing quote/bracket right after one)."""
    last = current[-1].text
    return last in _SENTENCE_END or (last in _CLOSERS and len(current) > 1 and current[-2].text in _SENTENCE_END)


_LINE_BREAK = re.compile(rf"\r\n|[{_LINE_BREAKS}]")
_PARAGRAPH_SEPARATOR = "\u2029"


def _line_breaks(gap: str) -> list[int]:
    """Where each line break in GAP ends."""
    return [match.end() for match in _LINE_BREAK.finditer(gap)]


def _paragraph_break(gap: str, breaks: list[int]) -> bool:
    return len(breaks) > 1 or _PARAGRAPH_SEPARATOR in gap


SHORT_LINE = 40  # characters: bylines and short headlines; wrapped prose runs longer


def _ends_line_unit(text: str, current: list[Word], line_start: int) -> bool:
    """At a line break after a line (from LINE_START) that does not read as wrapped prose: headlines,
    bylines, datelines, list and table rows ("LONDON 1996-08-30", "Nadim Ladki", "Japan 2 Syria 1")
    end without a period, and the next line starts a new unit. A line that ends in a lower-case word
    or a joining symbol ("… said on" / "Thursday …") is wrapped prose; one that ends in a capitalised
    word is a unit only when it is short or has no lower case (a long line ending "… the European" /
    "Commission …" is wrapped), counted from where the sentence began if that is on the line."""
    word = current[-1]
    last = word.text
    if last in _CONTINUES:
        return False
    if not last[0].isalpha() or _is_link(last):
        return True  # a number, a date, a closing bracket, a colon, a link
    if last[0].islower():
        return False
    # the line from its start, or from where this sentence began on it ("… town. Yuri Kushko")
    line = text[max(line_start, current[0].start) : word.end]
    if not line.isascii():  # its length as read: composed, without invisible format characters
        line = _as_read(line)
    return len(line) <= SHORT_LINE or not any(c.islower() for c in line)


def split_sentences(text: str, style: WordStyle = PLAIN_WORDS) -> list[list[Word]]:
    """Words grouped into sentences: at a blank line or a paragraph separator; and after . ! ? (and
    closing quotes or brackets) or at the end of a line unit (see _ends_line_unit) when the next word
    starts with an upper-case letter, a digit, a quote or a bracket. Each character is looked at a
    bounded number of times, so a text of many lines takes time in proportion to its length."""
    words = words_of(text, style)
    sentences: list[list[Word]] = []
    current: list[Word] = []
    followers: list[Word | None] = [*words[1:], None] if words else []
    line_start = 0  # where the line of the current word begins
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
        if _INVISIBLE_GAP.fullmatch(gap):
            continue  # attached as the text shows it
        breaks = _line_breaks(gap)
        if _paragraph_break(gap, breaks) or (
            _starts_sentence(following)
            and (_ends_sentence(current) or (bool(breaks) and _ends_line_unit(text, current, line_start)))
        ):
            sentences.append(current)
            current = []
        if breaks:
            line_start = word.end + breaks[-1]
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


def as_read(sentences: list[list[str]], text: str) -> list[list[str]]:
    """The sentences' words, cut from TEXT, as a model reads them: composed (NFC) and without format
    characters, as its training data writes them, so that a decomposed "e" + U+0301 reaches the
    character features as the "é" they know and "Mer&shy;kel" as "Merkel". Only the model's view
    changes: the words' offsets, and so the answers' `text`, stay the caller's."""
    # nearly every text, asked in the order that costs least (a format character is neither ASCII nor
    # printable); a part of a composed text is composed too
    if text.isascii() or (unicodedata.is_normalized("NFC", text) and (text.isprintable() or not _FORMAT.search(text))):
        return sentences
    return [[_as_read(word) for word in words] for words in sentences]


def _as_read(word: str) -> str:
    plain = _FORMAT.sub("", unicodedata.normalize("NFC", word))
    return plain or word  # a token of format characters alone (sent as `tokens`): the tokenizer reads it as unknown
