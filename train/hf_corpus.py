"""Optional corpora from Hugging Face `datasets` (installed and online; not needed otherwise).

    --config.corpus=hf --config.hf_dataset=wmt14 --config.hf_config=de-en
    --config.hf_fields=translation.de,translation.en      # translation: source, target
    --config.task=lm --config.corpus=hf --config.hf_dataset=NAME --config.hf_fields=text

Fields are dotted paths into each record. The default offline runs never touch this module.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

from train.corpora import CorpusNotFoundError, normalize_whitespace


def _field(record: dict, path: str, index: int) -> str:
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
    return normalize_whitespace(value)


def load_hf_examples(
    name: str, config_name: str, split: str, fields: Sequence[str]
) -> list[str] | list[tuple[str, str]]:
    """Lines (one field) or (source, target) pairs (two fields) from a `datasets` dataset.

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
        texts = tuple(_field(record, path, index) for path in fields)
        if all(texts):
            examples.append(texts if len(texts) == 2 else texts[0])
    if not examples:
        raise ValueError(f"Hugging Face dataset {name!r} split {split!r} gave no examples.")
    return examples
