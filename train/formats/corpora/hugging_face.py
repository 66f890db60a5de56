"""A Hugging Face `datasets` dataset as a corpus (optional: installed and online; the default
offline runs never use it), e.g. `--config.corpus=hf --config.hf_dataset=wmt14
--config.hf_config=de-en --config.hf_fields=translation.de,translation.en`. Fields are dotted
paths into each record. Conversations (`--config.task=chat`) come from `hf-chat`, which reads
each row's `messages` column, or its `prompt` and `completion` columns, as TRL does
(`--config.corpus=hf-chat --config.hf_dataset=trl-lib/Capybara`).
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

from train.formats.corpora.conversations import Conversation, conversation_of
from train.formats.corpora.corpus import Corpus, CorpusNotFoundError
from train.formats.corpora.files import document_text


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


def load_hf_conversations(name: str, config_name: str, split: str) -> list[Conversation]:
    """The conversations of a `datasets` dataset: each row's `messages` column, or its
    `prompt` and `completion` columns (`train.formats.corpora.conversations`), as TRL reads them.

    Raises:
        CorpusNotFoundError: `datasets` is not installed.
        ValueError: a row that is not a conversation (naming the dataset, the row and the
            field), or no rows.
    """
    records = _load_records(name, config_name, split, "hf-chat", "'chat'")
    conversations = [
        conversation_of(dict(record), f"{name}[{split}] row {index}")
        for index, record in enumerate(records)
    ]
    if not conversations:
        raise ValueError(f"Hugging Face dataset {name!r} split {split!r} gave no rows.")
    return conversations


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
    records = _load_records(name, config_name, split, "hf", "'tsv'/'text'")
    examples: list = []
    for index, record in enumerate(records):
        texts = tuple(_hf_field(record, path, index, collapse) for path in fields)
        if all(texts):
            examples.append(texts if len(texts) == 2 else texts[0])
    if not examples:
        raise ValueError(f"Hugging Face dataset {name!r} split {split!r} gave no examples.")
    return examples


CORPORA = (
    Corpus(
        "hf",
        tasks=("translation", "lm"),
        formats="a Hugging Face datasets dataset (online): one field (lm) or two (translation)",
        read=lambda data: load_hf_examples(
            data.hf_dataset,
            data.hf_config,
            data.hf_split,
            data.hf_field_paths,
            data.collapses_whitespace,
        ),
        needs=(("hf_dataset", "a dataset name"),),
    ),
    Corpus(
        "hf-chat",
        tasks=("chat",),
        formats="a Hugging Face datasets dataset (online) with a 'messages' column, or "
        "'prompt' and 'completion' columns",
        read=lambda data: load_hf_conversations(data.hf_dataset, data.hf_config, data.hf_split),
        needs=(("hf_dataset", "a dataset name"),),
    ),
)
