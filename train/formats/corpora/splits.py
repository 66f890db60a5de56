"""A corpus's examples per split (`read_splits`: read by their entries in the corpus table,
then held out by a hash of each example's text, `split_examples`, or read from the user's
own validation and test files). The hash rule is the same for the in-memory path and the
token store's documents."""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence
from typing import NamedTuple

from train.formats.corpora import get_corpus
from train.formats.corpora.conversations import Conversation

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
    if isinstance(example, Conversation) or isinstance(getattr(example, "split_key", None), str):
        return example.split_key  # a conversation, a preference pair: their own key
    return "\t".join(sorted(example))


def split_fraction(example) -> float:
    """The example's position in [0, 1) under the split rule (see `split_examples`)."""
    digest = hashlib.blake2b(_split_key(example).encode("utf-8"), digest_size=_SPLIT_HASH_BYTES)
    return int.from_bytes(digest.digest(), "big") / _SPLIT_HASH_SCALE


def split_examples(examples: Sequence, valid_fraction: float, test_fraction: float) -> Splits:
    """Deterministic train/valid/test split by a hash of each example's text.

    Rule: hash the example's text (a string, a pair's two texts sorted and joined by a tab,
    so "ja-en" and "en-ja" split alike, or a conversation's `split_key`) to u in [0, 1);
    u < valid_fraction goes to valid, u < valid_fraction + test_fraction to test, the rest
    to train. The result depends neither on randomness nor on loading order, identical
    examples always share a split, and the split sizes are the fractions only
    approximately (a tiny corpus may get an empty split).

    Args:
        examples: strings, (source, target) string pairs, or conversations.
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


def load_examples(data) -> list:
    """The whole corpus the data section names, read by its entry in the corpus table:
    (source, target) pairs or text documents, whitespace-normalised or verbatim as
    `data.collapses_whitespace` says (the shipped parallel Bibles are always normalised:
    their markup removal leaves runs of spaces).

    Args:
        data: the data section (`train.config.sections.DataConfig`).

    Raises:
        CorpusNotFoundError: a corpus package is not installed.
        FileNotFoundError, ValueError: a user file is missing, unreadable or malformed.
    """
    return get_corpus(data.corpus).read(data)


def read_splits(data, file_corpus: str) -> Splits:
    """The data section's examples per split, as text: the corpus held out by hash
    (`data.hash_fractions`), and the user's own validation and test files (`valid_path`,
    `test_path`) read by the corpus's own reader where it reads files, else as
    `file_corpus` (the task's kind of file: TSV pairs, or text documents), with the
    corpus's settings.

    Args:
        data: the data section (`train.config.sections.DataConfig`).
        file_corpus: the corpus a task's own files are read as (`Task.file_corpus`).

    Raises:
        CorpusNotFoundError, FileNotFoundError, ValueError: as `load_examples`.
    """
    splits = split_examples(load_examples(data), *data.hash_fractions)
    reader = data.corpus if get_corpus(data.corpus).reads_files else file_corpus
    for name, path in (("valid", data.valid_path), ("test", data.test_path)):
        if path:
            # The reader and its path change together: a file corpus's section needs its path.
            own = dataclasses.replace(data, corpus=reader, corpus_path=path)
            splits = splits._replace(**{name: load_examples(own)})
    return splits
