"""A Hugging Face `datasets` dataset as a corpus (optional: installed and online; the default
offline runs never use it), e.g. `--config.corpus=hf --config.corpora.hf.dataset=wmt14
--config.corpora.hf.config=de-en --config.corpora.hf.fields=translation.de,translation.en`.
Fields are dotted paths into each record. Conversations (`--config.task=chat`) come from
`hf-chat`, which reads each row's `messages` column, or its `prompt` and `completion`
columns, as TRL does (`--config.corpus=hf-chat --config.corpora.hf.dataset=trl-lib/Capybara`).
Preference pairs (`--config.task=dpo`) come from `hf-preference`, each row in TRL's
preference formats (`prompt`, `chosen`, `rejected`; or `chosen` and `rejected` conversations
sharing their prompt), read as the `preference` JSON-lines corpus reads a line
(`--config.corpus=hf-preference --config.corpora.hf.dataset=trl-lib/ultrafeedback_binarized`).
A local directory of JSON-lines or Parquet files is a dataset too (`datasets` reads it
offline).

Options (`--config.corpora.hf.<field>`, once `--config.hf_<field>`):
    dataset   the dataset's name (needs `datasets`, online)
    config    its config name, if it has several
    split     the split to read (the run splits it itself)
    fields    corpus 'hf': comma-separated dotted field paths, 'src,tgt' (translation) or
              'text' (lm)
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Sequence
from typing import Any

from train.formats.corpora.conversations import Conversation, conversation_of
from train.formats.corpora.corpus import Corpus, CorpusNotFoundError
from train.formats.corpora.files import document_text
from train.formats.corpora.options import option_error
from train.formats.corpora.preferences import PreferencePair, pair_of

SECTION = "hf"


@dataclasses.dataclass(frozen=True)
class HuggingFaceOptions:
    """The 'hf' and 'hf-chat' corpora's options (the module docstring)."""

    dataset: str = ""
    config: str = ""
    split: str = "train"
    fields: str = ""

    def __post_init__(self):
        for field in ("dataset", "config", "split", "fields"):
            if not isinstance(getattr(self, field), str):
                raise option_error(SECTION, field, getattr(self, field), "must be a string")

    @property
    def field_paths(self) -> list[str]:
        """`fields` split at its commas: one dotted path per example field."""
        return [f for f in self.fields.split(",") if f]


OPTIONS = {SECTION: HuggingFaceOptions}


def _hf_field(record: dict, path: str, index: int, collapse: bool = True) -> str:
    value: Any = record
    for key in path.split("."):
        if not isinstance(value, dict) or key not in value:
            available = sorted(value) if isinstance(value, dict) else type(value).__name__
            raise ValueError(
                f"--config.corpora.hf.fields: record {index} has no field {path!r} (at {key!r}; "
                f"available: {available}); name the fields as dotted paths."
            )
        value = value[key]
    if not isinstance(value, str):
        raise ValueError(
            f"--config.corpora.hf.fields: field {path!r} of record {index} is "
            f"{type(value).__name__}, not text."
        )
    return document_text(value, collapse)


def _load_records(name: str, config_name: str, split: str, corpus: str, local: str):
    """The rows of a `datasets` dataset's split.

    Raises:
        CorpusNotFoundError: `datasets` is not installed (names `corpus` and the `local`
            corpora that read a file instead).
    """
    try:
        datasets = importlib.import_module("datasets")
    except ImportError as err:
        raise CorpusNotFoundError(
            f"corpus={corpus!r} needs the Hugging Face `datasets` package and a network "
            f"connection: pip install datasets (or use corpus={local} with a local file)."
        ) from err
    return datasets.load_dataset(name, config_name or None, split=split)


def _rows_read_by(read_row, name: str, config_name: str, split: str, corpus: str, local: str):
    """Each row of a `datasets` dataset's split read by `read_row(record, where)` (a
    conversation, a preference pair), `where` naming the dataset and the row.

    Raises:
        CorpusNotFoundError: `datasets` is not installed.
        ValueError: what `read_row` raises for a row, or no rows.
    """
    records = _load_records(name, config_name, split, corpus, local)
    rows = [read_row(dict(r), f"{name}[{split}] row {i}") for i, r in enumerate(records)]
    if not rows:
        raise ValueError(f"Hugging Face dataset {name!r} split {split!r} gave no rows.")
    return rows


def load_hf_conversations(name: str, config_name: str, split: str) -> list[Conversation]:
    """The conversations of a `datasets` dataset: each row's `messages` column, or its
    `prompt` and `completion` columns (`train.formats.corpora.conversations`), as TRL reads them.

    Raises:
        CorpusNotFoundError: `datasets` is not installed.
        ValueError: a row that is not a conversation (naming the dataset, the row and the
            field), or no rows.
    """
    return _rows_read_by(conversation_of, name, config_name, split, "hf-chat", "'chat'")


def load_hf_pairs(name: str, config_name: str, split: str) -> list[PreferencePair]:
    """The preference pairs of a `datasets` dataset, one per row, in TRL's formats
    (`train.formats.corpora.preferences.pair_of`).

    Raises:
        CorpusNotFoundError: `datasets` is not installed.
        ValueError: a row that is not a pair (naming the dataset, the row and the field), or
            no rows.
    """
    return _rows_read_by(pair_of, name, config_name, split, "hf-preference", "'preference'")


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
            f"--config.corpora.hf.fields={','.join(fields)!r}: give one field (lm) or two "
            "(translation: source,target)."
        )
    records = _load_records(name, config_name, split, "hf", "'tsv'/'text'")
    examples: list = []
    for index, record in enumerate(records):
        texts = tuple(_hf_field(record, path, index, collapse) for path in fields)
        if all(texts):
            examples.append(texts if len(texts) == 2 else texts[0])
    if not examples:
        raise ValueError(f"Hugging Face dataset {name!r} split {split!r} gave no examples.")
    return examples


def _check_fields(data, task) -> None:
    """A row gives as many fields as the task's examples hold (`TaskFacts.hf_fields`)."""
    options = data.corpora.hf
    if len(options.field_paths) != task.hf_fields:
        raise option_error(
            SECTION,
            "fields",
            options.fields,
            f"task={task.name!r} needs {task.hf_fields} comma-separated field path(s)",
        )


def _read(data) -> list:
    options = data.corpora.hf
    return load_hf_examples(
        options.dataset,
        options.config,
        options.split,
        options.field_paths,
        data.collapses_whitespace,
    )


CORPORA = (
    Corpus(
        "hf",
        tasks=("translation", "lm"),
        formats="a Hugging Face datasets dataset (online): one field (lm) or two (translation)",
        read=_read,
        needs=(("corpora.hf.dataset", "a dataset name"),),
        check=_check_fields,
    ),
    Corpus(
        "hf-chat",
        tasks=("chat",),
        formats="a Hugging Face datasets dataset (online) with a 'messages' column, or "
        "'prompt' and 'completion' columns",
        read=lambda data: load_hf_conversations(
            data.corpora.hf.dataset, data.corpora.hf.config, data.corpora.hf.split
        ),
        needs=(("corpora.hf.dataset", "a dataset name"),),
    ),
    Corpus(
        "hf-preference",
        tasks=("dpo",),
        formats="a Hugging Face datasets dataset (online, or a local directory of JSON-lines "
        "files) with 'prompt', 'chosen' and 'rejected' columns, or 'chosen' and 'rejected' "
        "conversations",
        read=lambda data: load_hf_pairs(
            data.corpora.hf.dataset, data.corpora.hf.config, data.corpora.hf.split
        ),
        needs=(("corpora.hf.dataset", "a dataset name or directory"),),
    ),
)
