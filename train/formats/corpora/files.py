"""The user's own files: plain text for a language model (documents: lines, paragraphs or
the whole file) and tab-separated sentence pairs for translation.

A document is read verbatim or whitespace-normalised (`document_text`, as
`--config.collapse_whitespace` resolves for the task), and a plain-text file's documents are
its lines, blank-line separated paragraphs or the whole file (`group_lines`). Bytes that are
not UTF-8, empty files and malformed lines are refused naming the file and line.

Options of the 'text' corpus (`--config.corpora.text.<field>`, once `--config.text_<field>`):
    documents   what a document of a plain-text file is: 'lines' (each non-blank line),
                'paragraphs' (blank-line separated), 'file' (each file whole)
    field       a token store's JSON-lines inputs (.jsonl[.gz|.zst]): the record's text field
    in_memory   task 'lm' without --config.store_dir: read the corpus in memory at every start
                instead of a token store prepared in the work directory
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from collections.abc import Iterable, Iterator
from typing import Any, ClassVar

from train.formats.corpora.corpus import Corpus
from train.formats.corpora.options import option_error


def normalize_whitespace(text: str) -> str:
    """Collapses every run of whitespace (full-width spaces included) to one space and strips.

    Args:
        text: any string.

    Returns:
        The normalised string.
    """
    return " ".join(text.split())


# What a document of a plain-text file is (`--config.corpora.text.documents`).
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
        raise ValueError(
            f"--config.corpora.text.documents={mode!r}: must be one of {TEXT_DOCUMENTS}."
        )


def lines_with_breaks(text: str) -> list[str]:
    """A text's lines split at "\n" only (not at the other Unicode line breaks), each
    keeping its "\n"."""
    lines = [line + "\n" for line in text.split("\n")]
    lines[-1] = lines[-1][:-1]
    return lines if lines[-1] else lines[:-1]


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


def read_lines(path: str | os.PathLike, what: str) -> list[tuple[int, str]]:
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


def read_json_records(path: str | os.PathLike, what: str, one: str) -> list[tuple[str, Any]]:
    """A JSON-lines file's records, each with where it stands (`path:line`), for a reader
    that checks them (`chats`, `preferences`).

    Args:
        path: the file.
        what: the file's kind in errors ('Chat file').
        one: what each line holds, in the error of a line that is not JSON ('conversation').

    Raises:
        FileNotFoundError, ValueError: as `read_lines`; a line that is not JSON (naming
            `path:line`).
    """
    records = []
    for number, line in read_lines(path, what):
        where = f"{path}:{number}"
        try:
            records.append((where, json.loads(line)))
        except json.JSONDecodeError as err:
            raise ValueError(
                f"{where}: not JSON ({err.msg} at column {err.colno}); each line holds one "
                f"{one} as a JSON object."
            ) from None
    return records


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
    for line_number, line in read_lines(path, "Parallel file"):
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


@dataclasses.dataclass(frozen=True)
class TextOptions:
    """The 'text' corpus's options (the module docstring)."""

    documents: str = "lines"
    field: str = "text"
    in_memory: bool = False

    # A resumed run may change these (how the data is read, not which data it is).
    READING: ClassVar[tuple[str, ...]] = ("field", "in_memory")

    def __post_init__(self):
        if self.documents not in TEXT_DOCUMENTS:
            raise option_error(
                "text", "documents", self.documents, f"must be one of {TEXT_DOCUMENTS}"
            )
        if not isinstance(self.field, str) or not self.field:
            raise option_error("text", "field", self.field, "must name the JSON field of the text")
        if not isinstance(self.in_memory, bool):
            raise option_error("text", "in_memory", self.in_memory, "must be True or False")


OPTIONS = {"text": TextOptions}

CORPORA = (
    Corpus(
        "tsv",
        tasks=("translation",),
        formats="a UTF-8 file of source<TAB>target lines",
        read=lambda data: read_parallel_tsv(data.corpus_path, data.collapses_whitespace),
        needs=(("corpus_path", "a file path"),),
        reads_files=True,
    ),
    Corpus(
        "text",
        tasks=("lm",),
        formats="UTF-8 text (documents: lines, paragraphs or the file) or JSON lines, "
        "a file or a glob, gzip or zstd compressed",
        read=lambda data: read_text_documents(
            data.corpus_path, data.corpora.text.documents, data.collapses_whitespace
        ),
        needs=(("corpus_path", "a file path"),),
        reads_files=True,
        store_files=True,
    ),
)
