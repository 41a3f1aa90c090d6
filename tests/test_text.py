import random
import re
import unicodedata

import numpy as np
import pytest
import torch

from nerserve.ner.data import read_split
from nerserve.ner.encoder import CharCNN, pool_subwords
from nerserve.ner.text import segment
from nerserve.ner.text.chars import SHAPES, CharFeeds, char_rows, encode_chars, shape_id
from nerserve.ner.text.segment import PLAIN_WORDS, WordStyle, as_read, split_sentences, words_of, words_of_tokens
from nerserve.ner.text.subword import (
    ATTENTION_COST_PER_POSITION,
    UNPADDED_ATTENTION_COST_PER_POSITION,
    SubwordEncoder,
    load_tokenizer,
    longest_first,
    pack_rows,
    packed_rows,
    packing_cost,
)


def sentences_of(text: str) -> list[str]:
    """Each sentence of TEXT as its words joined by spaces."""
    return [" ".join(w.text for w in s) for s in split_sentences(text)]


def test_words_have_exact_offsets() -> None:
    text = "EU rejects German call, says U.S. official — costs 3.5 million (approx.) in Köln."
    words = words_of(text)
    assert all(text[w.start : w.end] == w.text for w in words)
    assert [w.text for w in words][:5] == ["EU", "rejects", "German", "call", ","]
    assert "U.S." in [w.text for w in words] and "3.5" in [w.text for w in words] and "Köln" in [w.text for w in words]


def test_clitics_are_split_as_the_training_data_writes_them() -> None:
    text = "Russia's backing, O'Neill's goal: it doesn't matter, they're here, Gov't of St. Kitts’s"
    words = [w.text for w in words_of(text)]
    assert words[:4] == ["Russia", "'s", "backing", ","]
    assert words[4:6] == ["O'Neill", "'s"] and words[9:11] == ["does", "n't"] and words[13:15] == ["they", "'re"]
    assert "Gov't" in words and words[-2:] == ["Kitts", "’s"]
    assert all(text[w.start : w.end] == w.text for w in words_of(text))


def test_combining_marks_stay_in_their_word() -> None:
    """A decomposed accent (e + U+0301) or an Indic or Thai vowel sign is no symbol of its own: the
    words are those of the composed text, each with its offsets in the text as written."""
    composed = "José García moved to São Paulo ; नरेंद्र मोदी in กรุงเทพ"
    decomposed = unicodedata.normalize("NFD", composed)
    assert decomposed != composed
    words = words_of(decomposed)
    assert all(decomposed[w.start : w.end] == w.text for w in words)
    assert [unicodedata.normalize("NFC", w.text) for w in words] == composed.split()
    assert [w.text for w in words_of(composed)] == composed.split()
    assert [w.text for w in words_of("\u0301a b\u0301")] == ["\u0301", "a", "b\u0301"]  # a mark never starts a word


def test_format_characters_stay_in_their_word_but_a_zero_width_space_ends_it() -> None:
    text = "Angela Mer\u00adkel (\u00ad) met Ali\u200cReza in Ber\u2060lin\u200bToday"
    words = [w.text for w in words_of(text)]
    assert words == ["Angela", "Mer\u00adkel", "(", ")", "met", "Ali\u200cReza", "in", "Ber\u2060lin", "Today"]


def test_invisible_characters_outside_a_word_are_no_words() -> None:
    """A byte-order mark, a zero-width space, bidirectional marks and isolates around a name, a stray
    control character: none is a word, none is inside a word's offsets (so none is inside an
    entity's), and the words are those of the text without them."""
    text = "\ufeffJohn \u200fSmith\u200f met \u2068Angela Merkel\u2069 in \u202bNew York\u202c.\x00Then\x07 he left\u200b."
    words = words_of(text)
    assert [w.text for w in words] == [
        "John",
        "Smith",
        "met",
        "Angela",
        "Merkel",
        "in",
        "New",
        "York",
        ".",
        "Then",
        "he",
        "left",
        ".",
    ]
    assert all(text[w.start : w.end] == w.text for w in words)
    assert [w.text for w in words_of("caf\u0065\u0301\u200f")] == [
        "caf\u0065\u0301"
    ]  # a mark ends a word, a format character not


def test_underscores_at_a_words_edges_are_symbols_but_a_user_name_keeps_them() -> None:
    text = "_Emmanuel Macron_ met __Angela__ about snake_case, @akshayy_ and @ _Catalina_Nunez's"
    words = [w.text for w in words_of(text)]
    assert words[:9] == ["_", "Emmanuel", "Macron", "_", "met", "__", "Angela", "__", "about"]
    assert words[9] == "snake_case"
    assert words[-6:] == ["@", "akshayy_", "and", "@", "_Catalina_Nunez", "'s"]


def test_links_are_one_word_each_and_end_a_line_as_a_number_does() -> None:
    text = (
        "Visit http://t.co/QLOb9A8yp1 or www.microsoft.com/en-us/about. Mail john.smith@ibm.com, then "
        "@user about #Arsenal (https://en.wikipedia.org/wiki/Arsenal_F.C.)\nTICKETS AT https://x.com/a?b=1&c=2\nArsenal won."
    )
    words = [w.text for w in words_of(text)]
    assert words[:9] == [
        "Visit",
        "http://t.co/QLOb9A8yp1",
        "or",
        "www.microsoft.com/en-us/about",
        ".",
        "Mail",
        "john.smith@ibm.com",
        ",",
        "then",
    ]
    assert words[9:13] == ["@", "user", "about", "#"]  # a mention or a hashtag: its sign apart, as the tweets write it
    assert "https://en.wikipedia.org/wiki/Arsenal_F.C" in words and "https://x.com/a?b=1&c=2" in words
    assert sentences_of(text)[-1] == "Arsenal won ."
    assert [w.text for w in words_of("me@home, see: http")] == ["me", "@", "home", ",", "see", ":", "http"]


def test_a_lines_length_is_counted_as_read() -> None:
    """A byline of 40 characters is a line of its own however its letters are written."""
    byline = "By Nadim Ladki and José García in Zürich"
    assert len(byline) == 40
    for written in (byline, unicodedata.normalize("NFD", byline), byline.replace("Ladki", "Lad\u00adki")):
        assert len(split_sentences(f"{written}\nJapan began the defence of their title.")) == 2, written


def test_a_model_reads_the_words_composed_without_format_characters() -> None:
    for text, read in (
        (unicodedata.normalize("NFD", "Zoë Müller"), ["Zoë", "Müller"]),
        ("Mer\u00adkel in Ber\u2060lin \u00ad", ["Merkel", "in", "Berlin"]),
        ("Zoe Muller", ["Zoe", "Muller"]),
    ):
        sentences = [[w.text for w in s] for s in split_sentences(text)]
        assert [text[w.start : w.end] for s in split_sentences(text) for w in s] == sentences[0]  # offsets: the text's
        assert as_read(sentences, text) == [read]


def test_sentence_split() -> None:
    text = 'Peter left Paris. He said "it rains." Then 3 people came!'
    sentences = split_sentences(text)
    assert [[w.text for w in s][-1] for s in sentences] == [".", '"', "!"]
    assert sum(len(s) for s in sentences) == len(words_of(text))


def test_tokens_joined_by_single_spaces() -> None:
    text, words = words_of_tokens(["New", "York", "!"])
    assert text == "New York !"
    assert [text[w.start : w.end] for w in words] == ["New", "York", "!"]


def test_shapes_and_chars() -> None:
    assert SHAPES[shape_id("Paris")] == "capitalised"
    assert SHAPES[shape_id("NATO")] == "upper"
    assert SHAPES[shape_id("iPhone")] == "mixed"
    assert SHAPES[shape_id("1996")] == "digit"
    chars = encode_chars([char_rows(["Ab", "c"]), char_rows(["d"])], 2)
    char_ids = char_grid(chars)
    assert char_ids.shape == (2, 2, 2) and chars.shape_ids[1, 1] == 0 and char_ids[0, 1, 1] == 0
    # a 0 before every word and one at the end: a width-3 window never reads into a neighbour
    assert (chars.stream == 0).sum() == 4 and chars.stream[0] == chars.stream[-1] == 0


def char_grid(chars: CharFeeds) -> np.ndarray:
    """The [B, N, C] grid of character ids (0: padding) that the stream and its index describe."""
    return np.append(chars.stream, 0)[chars.positions]


def test_the_character_cnn_on_the_stream_is_the_convolution_of_each_padded_word() -> None:
    torch.manual_seed(0)
    cnn = CharCNN(char_dim=8, filters=6)
    sentences = [["EU", "rejects", "Müller", "."], ["a" * 30 + "Z", "x"], []]
    chars = encode_chars([char_rows(s) for s in sentences], 4)
    grid = torch.from_numpy(char_grid(chars)).reshape(-1, chars.positions.shape[2])
    with torch.no_grad():
        got = cnn(torch.from_numpy(chars.stream), torch.from_numpy(chars.positions))
        # the plain formulation: every word padded to C on its own, convolved, padding masked out
        hidden = torch.relu(cnn.conv(cnn.embedding(grid).transpose(1, 2)))
        expected = hidden.masked_fill(~(grid > 0).unsqueeze(1), 0.0).amax(dim=2).reshape(got.shape)
    assert got.shape == (3, 4, 6) and torch.allclose(got, expected, atol=1e-6)
    assert not got[1, 2:].any() and not got[2].any()  # padding words have no character features


def test_subword_map_covers_every_word(tiny_backbone) -> None:
    encoder = SubwordEncoder(load_tokenizer(tiny_backbone))
    batch = encoder.encode([["Unbelievably", "long", "\u200b", "words"], ["Hi"]])
    assert batch.word_mask.tolist() == [[1, 1, 1, 1], [1, 0, 0, 0]]
    assert batch.subword_mask[0].sum(axis=1).min() >= 1  # the zero-width word maps to [UNK]
    assert batch.subword_mask[0, 0].sum() > 1  # a word split into several pieces
    assert batch.token_counts[1] == 3 and batch.sentence_positions == (2, max(batch.token_counts))


def test_max_pooling_over_every_slot_is_the_max_over_a_words_subwords(tiny_backbone) -> None:
    """A word's unused sub-word slots repeat its first sub-word, so the graphs' max pooling needs
    no mask: it equals the max over the word's own sub-words."""
    sentences = [["Unbelievably", "long", "words"], ["Hi", "Antidisestablishment"]]
    batch = SubwordEncoder(load_tokenizer(tiny_backbone)).encode(sentences)
    hidden = torch.randn(2, batch.subword_index.max() + 1, 8)
    pooled = pool_subwords(hidden, torch.from_numpy(batch.subword_index), torch.from_numpy(batch.subword_mask), "max")
    for b, words in enumerate(batch.word_mask):
        for i in np.flatnonzero(words):
            pieces = batch.subword_index[b, i, : int(batch.subword_mask[b, i].sum())]
            assert torch.equal(pooled[b, i], hidden[b, pieces].max(dim=0).values)
            assert set(batch.subword_index[b, i].tolist()) == set(pieces.tolist())
    assert batch.subword_mask.sum(axis=2).max() > 1 and (batch.subword_mask == 0).any()


def test_sentences_packed_into_rows_come_back_whole(tiny_backbone) -> None:
    """Each packed sentence keeps its own ids, segment and positions from 0, and token_index takes
    every sentence position back to the row position that holds it."""
    sentences = [["Unbelievably", "long", "words"], ["Hi"], ["Peter", "Blackburn", "arrived"], ["a"] * 9]
    packed = SubwordEncoder(load_tokenizer(tiny_backbone), row_subwords=16).encode(sentences)
    alone = SubwordEncoder(load_tokenizer(tiny_backbone), row_subwords=0).encode(sentences)
    assert packed.input_ids.shape[0] < len(sentences) and alone.input_ids.shape[0] == len(sentences)
    for batch in (packed, alone):
        flat_ids, flat_segments = batch.input_ids.reshape(-1), batch.segment_ids.reshape(-1)
        flat_positions = batch.position_ids.reshape(-1)
        for b, count in enumerate(batch.token_counts):
            where = batch.token_index[b, :count]
            assert flat_ids[where].tolist() == alone.input_ids[b, :count].tolist()
            assert flat_positions[where].tolist() == list(range(count))
            assert len(set(flat_segments[where].tolist())) == 1 and flat_segments[where][0] > 0
            assert len(set(where.tolist())) == count
    assert (packed.segment_ids > 0).sum() == sum(packed.token_counts)  # nothing but padding beside them
    assert packed.subword_index.tolist() == alone.subword_index.tolist()  # the word map is per sentence


def test_pack_rows_first_fit_decreasing() -> None:
    assert pack_rows([5, 9, 3, 4], 10) == [[1], [0, 3], [2]]
    assert pack_rows([5, 9, 3, 4], 0) == [[0], [1], [2], [3]]
    assert pack_rows([20, 12, 8], 10) == [[0], [1, 2]]  # rows as long as the longest sentence
    assert sorted(i for row in pack_rows([7, 1, 8, 2, 2, 6], 9) for i in row) == list(range(6))


def test_line_units_and_paragraphs_end_sentences() -> None:
    """Headlines, bylines and datelines end without a period on a line of their own; wrapped prose
    ("… said on" / "Thursday …") and lower-case continuations run on; a blank line always ends."""
    text = (
        "JAPAN GET LUCKY WIN\nNadim Ladki\nAL-AIN, United Arab Emirates 1996-12-06\n"
        "Japan began the defence of their title, the officials said on\nThursday in Al-Ain.\n\n"
        "next paragraph starts here\nand runs on."
    )
    assert sentences_of(text) == [
        "JAPAN GET LUCKY WIN",
        "Nadim Ladki",
        "AL-AIN , United Arab Emirates 1996-12-06",
        "Japan began the defence of their title , the officials said on Thursday in Al-Ain .",
        "next paragraph starts here and runs on .",
    ]
    assert split_sentences("Dr. Jones visited St. Louis in Jan. 1996.")[0][-1].text == "."
    assert len(split_sentences("Dr. Jones visited St. Louis in Jan. 1996.")) == 1


@pytest.mark.parametrize(
    ("line", "paragraph"),
    [("\r\n", "\r\n\r\n"), ("\r", "\r\r"), ("\u2028", "\u2029"), ("\f", "\f\f"), ("\v", "\v\v"), ("\x85", "\x85\x85")],
    ids=["CRLF", "CR", "Unicode separators", "form feed", "vertical tab", "NEL"],
)
def test_every_line_boundary_ends_lines_as_a_line_feed_does(line: str, paragraph: str) -> None:
    """What str.splitlines takes for a line boundary: Windows' and old Macs' line ends, the form
    feed between pdftotext's pages, Unicode's line and paragraph separators."""
    text = (
        "JAPAN GET LUCKY WIN{line}1. Nadim Ladki{line}AL-AIN, United Arab Emirates 1996-12-06{line}"
        "Japan began the defence of their title, the officials said on{line}Thursday in Al-Ain.{paragraph}"
        "next paragraph starts here{line}and runs on."
    )
    written = sentences_of(text.format(line=line, paragraph=paragraph))
    assert written == sentences_of(text.format(line="\n", paragraph="\n\n")) and len(written) == 5


def test_words_follow_the_training_data_conventions() -> None:
    """Currencies and U.S.-compounds whole; a company suffix or a state that ends the sentence gives
    up its period (the data writes "Lear Corp ."), one inside it keeps it; titles always keep it."""
    cases = {
        "fell C$ 0.45 to US$ 101.15": ["fell", "C$", "0.45", "to", "US$", "101.15"],
        "U.S.-led planes": ["U.S.-led", "planes"],
        "Johnson Controls Inc and Lear Corp.": ["Johnson", "Controls", "Inc", "and", "Lear", "Corp", "."],
        'analyst at McDonald & Co. " It': ["analyst", "at", "McDonald", "&", "Co", ".", '"', "It"],
        "Lear Corp. officials met Dr. Jones": ["Lear", "Corp.", "officials", "met", "Dr.", "Jones"],
        # what the data writes on a number stays on it; a date, a score, a sign or a unit symbol apart
        "the 26-year-old 11th-seeded 1st in the 1990s": ["the", "26-year-old", "11th-seeded", "1st", "in", "the", "1990s"],
        "a 2.5-fold 50-kDa 12-O-tetradecanoylphorbol-13-acetate": [
            "a",
            "2.5-fold",
            "50-kDa",
            "12-O-tetradecanoylphorbol-13-acetate",
        ],
        "on 1996-08-30 won 4-38 , 5% $5": ["on", "1996-08-30", "won", "4-38", ",", "5", "%", "$", "5"],
        "said -- wait ... 5 +/- 2 , 3.5 - 1.": ["said", "--", "wait", "...", "5", "+/-", "2", ",", "3.5", "-", "1", "."],
    }
    for text, expected in cases.items():
        assert [w.text for w in words_of(text)] == expected, text


def test_a_results_tables_numbered_lines_and_an_ellipsis_split_as_the_data_does() -> None:
    text = "RESULTS\n1. Michael Johnson (U.S.) 19.32\n2. Frankie Fredericks (Namibia) 19.68\nHe said... Then came 2. Left."
    assert sentences_of(text) == [
        "RESULTS",
        "1. Michael Johnson ( U.S. ) 19.32",
        "2. Frankie Fredericks ( Namibia ) 19.68",
        "He said ...",
        "Then came 2 .",
        "Left .",
    ]


def test_empty_and_blank_texts_have_no_sentences() -> None:
    assert split_sentences("") == [] and split_sentences("  \n\n ") == []


def test_each_batch_takes_the_row_length_that_costs_least() -> None:
    """Rows as long as the longest sentence when lengths are even (no padding to gain), longer
    rows when short sentences fill them, never longer than the bound."""
    even = [40] * 6
    assert packed_rows(even, 256) == [[i] for i in range(6)]  # 6 × 40 beats 2 × 120 and its attention
    skewed = [60, 10, 10, 10, 10, 10, 10]
    rows = packed_rows(skewed, 256)
    assert rows == [[0], [1, 2, 3, 4, 5, 6]] and packing_cost(skewed, rows) < packing_cost(skewed, pack_rows(skewed, 0))
    assert packed_rows([200, 50, 50], 128) == [[0], [1, 2]]  # a sentence over the bound sets the row length
    assert packed_rows([5, 5], 0) == [[0], [1]]
    assert packed_rows([0, 5, 0], 16) == pack_rows([0, 5, 0], 5) == [[1, 0, 2]]  # empty sentences fit anywhere
    # where padding costs attention alone (an unpadded backbone), short sentences share shorter rows
    one_long = [20, *[6] * 9]
    assert packed_rows(one_long, 256) == [list(range(10))]
    assert packed_rows(one_long, 256, UNPADDED_ATTENTION_COST_PER_POSITION) == [[0], [1, 2, 3], [4, 5, 6], [7, 8, 9]]


def test_character_features_fill_each_word_in_its_place() -> None:
    from nerserve.ner.text.chars import MAX_WORD_CHARS, char_id

    sentences = [["EU", "rejects", "Müller", "中国"], ["a" * 30 + "Z"], ["3.5", "-"]]
    chars = encode_chars([char_rows(s) for s in sentences], 5)
    char_ids, shape_ids = char_grid(chars), chars.shape_ids
    assert char_ids.shape == (3, 5, MAX_WORD_CHARS) and shape_ids.shape == (3, 5)
    for b, words in enumerate(sentences):
        for i, word in enumerate(words):
            clipped = word if len(word) <= MAX_WORD_CHARS else word[:10] + word[-10:]
            assert char_ids[b, i, : len(clipped)].tolist() == [char_id(c) for c in clipped]
            assert not char_ids[b, i, len(clipped) :].any() and shape_ids[b, i] == shape_id(word)
        assert not char_ids[b, len(words) :].any() and not shape_ids[b, len(words) :].any()


def test_words_tokenised_once_are_what_the_sentence_would_give(data_root) -> None:  # type: ignore[no-untyped-def]
    from nerserve.ner.backbone import resolve_backbone
    from nerserve.ner.data import read_split

    encoder = SubwordEncoder(load_tokenizer(resolve_backbone().path))
    assert encoder.word_pieces is not None  # WordPiece splits each word alone
    sentences = [list(s.tokens) for name in ("conll03", "genia") for s in read_split(data_root / name, "dev", 300)]
    assert encoder.tokenize(sentences) == encoder.tokenize_sentences(sentences)
    assert encoder.tokenize(sentences[:5]) == encoder.tokenize_sentences(sentences[:5])  # from the cache


def test_a_word_the_vocabulary_lacks_is_read_in_its_plain_form_and_a_known_one_as_it_is() -> None:
    from nerserve.ner.backbone import resolve_backbone

    encoder = SubwordEncoder(load_tokenizer(resolve_backbone().path))
    styled = ["Ａｎｇｅｌａ", "Ｍｅｒｋｅｌ", "𝐁𝐞𝐫𝐥𝐢𝐧", "１９９６"]
    plain = ["Angela", "Merkel", "Berlin", "1996"]
    known = ["…", "km²", "½", "ﬁnance", "Merkel"]  # in the vocabulary as they are: not normalised
    unreadable = ["ℬᎯℛℬℐℰ"]  # unknown in either form: kept
    for tokenize in (encoder.tokenize, encoder.tokenize_sentences):
        (sentence,) = tokenize([styled + known + unreadable])
        (expected,) = encoder.tokenize_sentences([plain])
        assert sentence.pieces[:4] == expected.pieces
        assert sentence.words == tuple(styled + known + unreadable)  # offsets stay the text's
        for word, pieces in zip(known + unreadable, sentence.pieces[4:], strict=True):
            assert pieces == tuple(encoder.tokenizer.encode(word, add_special_tokens=False).ids) or pieces == (
                encoder.unk_id,
            ), word
    assert encoder.unk_id in encoder.tokenize([unreadable])[0].pieces[0]


@pytest.mark.parametrize("attention", [ATTENTION_COST_PER_POSITION, UNPADDED_ATTENTION_COST_PER_POSITION])
def test_packed_rows_is_the_cheapest_first_fit_of_every_row_length(attention: float) -> None:
    """packed_rows (runs of equal lengths placed together, row lengths past the cost floor skipped)
    gives the same rows as first-fit decreasing one sentence at a time at every candidate row length,
    the cheapest kept (the first of equal costs), whatever attention costs."""
    generator = random.Random(7)
    for _ in range(300):
        lengths = [
            generator.choice([generator.randint(3, 30), generator.randint(3, 200)]) for _ in range(generator.randint(1, 300))
        ]
        longest_row = generator.choice([64, 128, 256, 512])
        longest = max(lengths)
        candidates = [longest, *range(longest - longest % 16 + 16, longest_row + 1, 16)]
        order = longest_first(lengths)
        packings = (pack_rows(lengths, c, order) for c in candidates)
        one_at_a_time = min(packings, key=lambda rows: packing_cost(lengths, rows, attention))
        assert packed_rows(lengths, longest_row, attention) == one_at_a_time


def test_the_abbreviations_lookahead_only_saves_time(data_root) -> None:  # type: ignore[no-untyped-def]
    """Words found with the lookahead before the titles' and suffixes' alternations are the words
    found without it: on every name in both lists (and its upper case) in the contexts its rules
    read, and on the three datasets' test sentences."""
    unguarded = re.compile(re.sub(r"\(\?=\[A-Za-z\]\{\d+,\d+\}\\\.\)", "", segment._WORD.pattern), re.VERBOSE)
    assert unguarded.pattern != segment._WORD.pattern
    names = segment.TITLES + segment.SUFFIXES
    texts = [
        f"{prefix}{n}. {after}"
        for n in names + [n.upper() for n in names]
        for prefix in ("", "see ")
        for after in ("Smith", "the", "")
    ]
    texts += [" ".join(s.tokens) for folder in ("conll03", "genia", "cadec") for s in read_split(data_root / folder, "test")]
    for text in texts:
        assert [m.span() for m in segment._WORD.finditer(text)] == [m.span() for m in unguarded.finditer(text)], text


def test_plus_signs_stay_on_their_word_where_no_word_follows() -> None:
    text = "CD4+ T cells and Ca2+ influx; CD4+CD25+ cells, A+B, rated AA+. C++ and 4+ years (CD8+)"
    words = [w.text for w in words_of(text)]
    assert words[:6] == ["CD4+", "T", "cells", "and", "Ca2+", "influx"]
    assert words[7:10] == ["CD4", "+", "CD25+"] and words[12:15] == ["A", "+", "B"] and "AA+" in words
    assert words[-8:] == ["C++", "and", "4", "+", "years", "(", "CD8+", ")"]


def test_a_word_style_is_read_off_how_a_corpus_writes_its_tokens(data_root) -> None:
    """GENIA writes "p50/p65", "1,25(OH)2D3" and "5'-flanking" whole and cuts "-induced" off "IL-2";
    CoNLL-2003 writes "US / UK" apart."""
    genia = WordStyle.written_in(s.tokens for s in read_split(data_root / "genia", "train", limit=4000))
    conll = WordStyle.written_in(s.tokens for s in read_split(data_root / "conll03", "train", limit=4000))
    assert genia.slashes and genia.brackets and genia.primes
    assert {"induced", "mediated"} <= set(genia.suffixes) and "specific" not in genia.suffixes  # 58 apart, 472 whole
    assert not genia.initials  # sentences ending "B ." outnumber "J. Smith" five to one
    assert conll == PLAIN_WORDS
    assert WordStyle.written_in([["of", "NF-kappa", "B", "."], ["J.", "Smith"], ["type", "I", "."]]).initials is False
    assert WordStyle.written_in([["of", "NF-kappa", "B", "."], ["J.", "Smith"]]).initials is True  # as often as not
    assert WordStyle.written_in([["US", "/", "UK"], ["and/or"]]) == PLAIN_WORDS  # as often apart as whole
    assert WordStyle.written_in([["IL-2", "-induced"], ["ligand-induced"], ["X", "-induced"]]).suffixes == ("induced",)


def test_words_are_cut_in_a_models_style() -> None:
    text = "p50/p65 binds the 5'-flanking region of 1,25(OH)2D3 in CD4(+) cells (n=3), [3H]thymidine by 1,25(OH)2D3."
    genia = [w.text for w in words_of(text, WordStyle(slashes=True, brackets=True, primes=True))]
    assert genia[:4] == ["p50/p65", "binds", "the", "5'-flanking"] and "1,25(OH)2D3" in genia and "CD4(+)" in genia
    assert genia[-4:] == ["[3H]thymidine", "by", "1,25(OH)2D3", "."]
    assert genia[genia.index("cells") + 1 : genia.index("cells") + 6] == [
        "(",
        "n",
        "=",
        "3",
        ")",
    ]  # a bracket apart stays apart
    plain = [w.text for w in words_of(text)]
    assert plain[:3] == ["p50", "/", "p65"] and "1,25(OH)2D3" not in plain
    assert all(text[w.start : w.end] == w.text for w in words_of(text, WordStyle(slashes=True, brackets=True, primes=True)))


def test_a_suffix_the_style_cuts_off_is_a_word_of_its_own() -> None:
    """ "IL-2-induced" as GENIA writes it ("IL-2", "-induced"), so the entity "IL-2" can be found."""
    style = WordStyle(brackets=True, suffixes=("induced", "mediated"))
    text = "IL-2-induced and TNF-alpha-mediated, 1,25(OH)2D3-induced and 5-induced; IL-2-dependent, the -induced"
    words = [w.text for w in words_of(text, style)]
    assert words[:5] == ["IL-2", "-induced", "and", "TNF-alpha", "-mediated"]
    assert words[6:10] == ["1,25(OH)2D3", "-induced", "and", "5"] and words[10] == "-induced"
    assert "IL-2-dependent" in words and words[-1] == "-induced"
    assert [w.text for w in words_of(text)][:3] == ["IL-2-induced", "and", "TNF-alpha-mediated"]


def test_a_papers_abbreviations_end_no_sentence() -> None:
    text = "As shown by Smith et al. (1990), IL-2 binds. As shown in Fig. 2, it works; cf. Eq. 3 for approx. 5 mg."
    assert sentences_of(text) == [
        "As shown by Smith et al. ( 1990 ) , IL-2 binds .",
        "As shown in Fig. 2 , it works ; cf. Eq. 3 for approx. 5 mg .",
    ]


def test_a_sentence_may_start_with_a_bracket_or_a_name_written_in_lower_case() -> None:
    """GENIA's titles are written in brackets, and biomedical sentences start on gene names written
    in lower case; a plain lower-case word after a period goes on the sentence."""
    text = "It binds c-myc. c-myc is here. [Effects of IL-2]. cDNA clones bind. mRNA rose. We saw approx. five mice."
    assert sentences_of(text) == [
        "It binds c-myc .",
        "c-myc is here .",
        "[ Effects of IL-2 ] .",
        "cDNA clones bind .",
        "mRNA rose .",
        "We saw approx. five mice .",
    ]
    assert sentences_of("The dose was 5 mg. and then more. p50 binds.") == [
        "The dose was 5 mg . and then more .",
        "p50 binds .",
    ]


def test_in_a_style_whose_sentences_end_on_capitals_a_capitals_period_ends_its_sentence() -> None:
    """GENIA ends many a sentence on a lone capital ("NF-kappa B ."), CoNLL-2003 writes initials
    before names ("J. Smith"): in GENIA's style the capital and the period are two words and the
    next sentence starts, but for the initials of a citation's authors."""
    text = "It activates NF-kappa B. We show it (S. Miyatake, M. Seiki, and K. Arai, 1988). J. Smith agreed."
    genia = WordStyle(initials=False)
    assert [" ".join(w.text for w in s) for s in split_sentences(text, genia)] == [
        "It activates NF-kappa B .",
        "We show it ( S. Miyatake , M. Seiki , and K. Arai , 1988 ) .",
        "J .",
        "Smith agreed .",
    ]
    assert sentences_of(text) == [
        "It activates NF-kappa B. We show it ( S. Miyatake , M. Seiki , and K. Arai , 1988 ) .",
        "J. Smith agreed .",
    ]


def test_han_ideographs_and_hiragana_are_a_word_each() -> None:
    """As Unicode's word boundaries have them: a Chinese or Japanese text written without spaces is
    read whole, word by word, rather than as one word clipped to a window's sub-words."""
    text = "Obama visited 北京 and 東京タワーに行きました。 Merkel (德国总理)"
    words = [w.text for w in words_of(text)]
    assert words[:7] == ["Obama", "visited", "北", "京", "and", "東", "京"]
    assert words[7:15] == ["タワー", "に", "行", "き", "ま", "し", "た", "。"]  # katakana stays joined
    assert words[-6:] == ["(", "德", "国", "总", "理", ")"]
    assert all(text[w.start : w.end] == w.text for w in words_of(text))
