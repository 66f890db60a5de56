"""A corpus's input files as documents: what `train.data.store.store_prepare` reads.

- `input_files`: a `--config.corpus_path` file or glob (`**` allowed), sorted; nothing
  matched and empty files are refused.
- `plan_shards`: the shards of the inputs, a function of the files alone: an uncompressed
  file's byte ranges of about `store_shard_bytes` (a line belongs to the range its first
  byte is in), or a whole file where a document may span lines (`corpora.text.documents`
  'paragraphs' or 'file') or the file is compressed (`.gz`, `.zst`); the shipped KJV is one
  shard. The user's own validation and test files (`valid_path`, `test_path`, any format
  `corpus_path` takes) are shards too, whose documents all go to that split.
- `documents`: a shard's documents: plain text as `corpora.text.documents` says (non-blank lines,
  blank-line separated paragraphs, or the whole file), or the `text_field` of each JSON line
  (`.jsonl`, `.json`), verbatim or whitespace-normalised (`collapse_whitespace`); bytes that
  are not UTF-8, lines that are not JSON, records without the field and lone surrogates
  are refused naming the file and offset.
- `split_of`: a document's split, by the hash rule of
  `train.formats.corpora.splits.split_examples`, or its shard's `role`.
"""

from __future__ import annotations

import dataclasses
import glob
import gzip
import io
import json
import os
import pathlib
from collections.abc import Iterator

from train.data.store.token_store import StoreError
from train.data.tokenizer import check_encodable
from train.formats import corpora
from train.formats.corpora.files import document_text, group_lines
from train.formats.corpora.splits import split_fraction

_JSON_SUFFIXES = (".jsonl", ".json")
# The kinds of a shard read from the user's files; any other kind names a shipped corpus.
FILE_KINDS = ("text", "jsonl")
_COMPRESSIONS = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}


@dataclasses.dataclass(frozen=True)
class Source:
    """One shard's input: a byte range of an uncompressed file, a whole compressed file, or
    a whole shipped corpus (`kind` its name, e.g. 'kjv').

    Attributes:
        path: the file ('' for the KJV).
        start, stop: the byte range (stop -1: to the end).
        kind: 'text', 'jsonl', or the name of a shipped corpus (`train.formats.corpora`).
        compression: '', 'gzip' or 'zstd'.
        role: '' (the corpus: each document split by hash), or 'valid' / 'test' (the
            user's own file of that split: every document goes there).
    """

    path: str
    start: int
    stop: int
    kind: str
    compression: str
    role: str = ""


def _kind_of(path: pathlib.Path) -> tuple[str, str]:
    """(kind, compression) of an input file, from its suffixes."""
    compression = _COMPRESSIONS.get(path.suffix.lower(), "")
    stem = path.with_suffix("") if compression else path
    return ("jsonl" if stem.suffix.lower() in _JSON_SUFFIXES else "text"), compression


def input_files(pattern: str, field: str = "corpus_path") -> list[pathlib.Path]:
    """The files a `--config.corpus_path` (or the `field` named) names: one path or a glob,
    sorted.

    Raises:
        FileNotFoundError: nothing matches (names the pattern).
        StoreError: a matched file is empty.
    """
    expanded = os.path.expanduser(pattern)
    files = sorted(pathlib.Path(p) for p in glob.glob(expanded, recursive=True))
    files = [f for f in files if f.is_file()]
    if not files:
        raise FileNotFoundError(
            f"--config.{field}={pattern!r} matches no file ; give a file or a glob such "
            "as 'data/*.jsonl.zst' (quote it so the shell does not expand it)."
        )
    for f in files:
        if f.stat().st_size == 0:
            raise StoreError(
                f"--config.{field}={pattern!r}: {f} is empty ; remove it or narrow the glob."
            )
    return files


def plan_shards(data) -> list[Source]:
    """The shards of the data section's corpus and of its own validation and test files
    (see the module docstring)."""
    corpus = corpora.get_corpus(data.corpus)
    if corpus.store_files:
        sources = _file_shards(data, data.corpus_path, "corpus_path", "")
    elif corpus.documents is not None:  # a shipped corpus: one shard, read whole
        sources = [Source("", 0, -1, corpus.name, "")]
    else:
        raise StoreError(
            f"--config.corpus={data.corpus!r}: a token store is prepared from one of "
            f"{corpora.storable()} ; set --config.store_dir='' to read this corpus in memory."
        )
    for field, role in (("valid_path", "valid"), ("test_path", "test")):
        if getattr(data, field):
            sources += _file_shards(data, getattr(data, field), field, role)
    return sources


def _file_shards(data, pattern: str, field: str, role: str) -> list[Source]:
    sources = []
    whole_files = data.corpora.text.documents != "lines"  # a document may span lines
    for path in input_files(pattern, field):
        kind, compression = _kind_of(path)
        size = path.stat().st_size
        if compression or (whole_files and kind == "text"):
            sources.append(Source(str(path), 0, -1, kind, compression, role))
            continue
        for start in range(0, size, data.store_shard_bytes):
            stop = min(start + data.store_shard_bytes, size)
            sources.append(Source(str(path), start, stop, kind, "", role))
    return sources


def _open_binary(source: Source):
    if source.compression == "gzip":
        return gzip.open(source.path, "rb")
    if source.compression == "zstd":
        try:
            import zstandard
        except ImportError as err:
            raise StoreError(
                f"{source.path} is zstd-compressed and the `zstandard` package is missing ; "
                "pip install -r requirements.txt."
            ) from err
        raw = open(source.path, "rb")  # noqa: SIM115 (closed with the reader)
        return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(raw, closefd=True))
    return open(source.path, "rb")


def _raw_lines(source: Source) -> Iterator[tuple[int, bytes]]:
    """(offset, line) of the lines whose first byte lies in the source's range."""
    with _open_binary(source) as f:
        if source.start > 0:
            f.seek(source.start - 1)
            f.readline()  # the rest of the line in progress belongs to the range before
        while True:
            offset = f.tell()
            if source.stop >= 0 and offset >= source.stop:
                return
            line = f.readline()
            if not line:
                return
            yield offset, line


def documents(
    source: Source, text_field: str, mode: str = "lines", collapse: bool = True
) -> Iterator[str]:
    """The source's documents, blank ones skipped.

    Args:
        source: the shard.
        text_field: the text field of JSON lines.
        mode: what a document of a plain-text file is (`train.formats.corpora.files.group_lines`).
        collapse: normalise each document's whitespace; False keeps it exactly.

    Raises:
        StoreError: bytes that are not UTF-8 (names the file and offset), a JSON line that
            does not parse or lacks `text_field`, or a text with a lone surrogate (names
            the file, offset and field).
    """
    if source.kind not in FILE_KINDS:  # a shipped corpus, named by its entry
        yield from corpora.get_corpus(source.kind).documents(collapse)
        return
    if source.kind == "text":
        lines = (line for _, line in _decoded_lines(source, text_field))
        docs = group_lines(lines, mode)
    else:
        docs = (line for _, line in _decoded_lines(source, text_field))
    for doc in docs:
        text = document_text(doc, collapse)
        if text:
            yield text


def _decoded_lines(source: Source, text_field: str) -> Iterator[tuple[int, str]]:
    """(offset, text) of the source's lines: a plain-text line with its line break, or a
    JSON line's `text_field` (blank JSON lines skipped)."""
    where = " (decompressed)" if source.compression else ""
    for offset, raw in _raw_lines(source):
        if offset == 0 and raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]  # a UTF-8 byte order mark
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise StoreError(
                f"{source.path}: bytes that are not UTF-8 at byte offset {offset + err.start}"
                f"{where} ({err.reason}) ; re-save the file as UTF-8 or remove it from "
                "--config.corpus_path."
            ) from None
        if source.kind == "jsonl":
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise StoreError(
                    f"{source.path}: the line at byte offset {offset}{where} is not JSON "
                    f"({err.msg}) ; fix the line, or name a plain-text file (not .jsonl)."
                ) from None
            text = record.get(text_field) if isinstance(record, dict) else None
            if not isinstance(text, str):
                fields = sorted(record) if isinstance(record, dict) else type(record).__name__
                raise StoreError(
                    f"{source.path}: the record at byte offset {offset}{where} has no text "
                    f"field {text_field!r} (it has {fields}) ; set --config.corpora.text.field to "
                    "the field holding the text."
                )
            if b"\\u" in raw:  # only an escape can make a lone surrogate
                try:
                    check_encodable(text)
                except ValueError as err:
                    raise StoreError(
                        f"{source.path}: the record at byte offset {offset}{where}: {err}"
                    ) from None
            line = text
        yield offset, line


def split_of(text: str, valid: float, test: float, role: str = "") -> tuple[str, float]:
    """(split, hash fraction) of a document: its shard's `role` where it has one, else by
    the hash rule with shares `valid` and `test`."""
    u = split_fraction(text)
    if role:
        return role, u
    return ("valid" if u < valid else "test" if u < valid + test else "train"), u
