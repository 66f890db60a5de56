"""The training program's data side: corpora, splits, batches and a resumable batch stream.

Corpora live in `train.corpora`, batching in `train.batching`; their public names are
re-exported here, so `from train import data` gives the whole pipeline:

    pairs = data.load_bible_parallel("ja-en")
    splits = data.split_examples(pairs, valid_fraction=0.01, test_fraction=0.01)
    ...tokenize splits.train into id pairs, then filter_by_length...
    stream = data.EpochStream(
        lambda rng: data.translation_batches(ids, bucket_lengths=..., batch_size=64, rng=rng),
        seed=0,
        state=saved_state,  # None on a fresh start
    )
    batch = next(stream); saved_state = stream.state_dict()  # JSON-serialisable
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Generic, NamedTuple, TypeVar

import numpy as np

from train.batching import (
    default_bucket_lengths,
    document_length,
    filter_by_length,
    lm_batches,
    packed_lm_batches,
    pair_length,
    translation_batches,
)
from train.corpora import (
    CorpusNotFoundError,
    load_bible_parallel,
    load_kjv_lines,
    load_kjv_web_pairs,
    normalize_whitespace,
    read_parallel_tsv,
    read_text_lines,
)

__all__ = [
    "CorpusNotFoundError",
    "EpochStream",
    "Splits",
    "check_token_ids",
    "default_bucket_lengths",
    "document_length",
    "epoch_rng",
    "filter_by_length",
    "lm_batches",
    "load_bible_parallel",
    "load_kjv_lines",
    "load_kjv_web_pairs",
    "normalize_whitespace",
    "packed_lm_batches",
    "pair_length",
    "read_parallel_tsv",
    "read_text_lines",
    "split_examples",
    "translation_batches",
]

T = TypeVar("T")

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


def _split_fraction(example) -> float:
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
        u = _split_fraction(example)
        if u < valid_fraction:
            splits.valid.append(example)
        elif u < valid_fraction + test_fraction:
            splits.test.append(example)
        else:
            splits.train.append(example)
    return splits


def check_token_ids(ids, vocab_size: int, where: str) -> None:
    """Raises if any id lies outside [0, vocab_size); call where data enters the program.

    JAX gathers clamp out-of-range indices, so a bad id would silently read another embedding.

    Args:
        ids: array-like of integer ids, any shape.
        vocab_size: the model's vocabulary size.
        where: what the ids are (e.g. "train batch 'src'"), for the message.

    Raises:
        ValueError: names the first offending id, its position and the vocab size.
    """
    array = np.asarray(ids)
    if array.size and not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"{where}: token ids must be integers, got dtype {array.dtype}.")
    bad = np.argwhere((array < 0) | (array >= vocab_size))
    if bad.size:
        position = tuple(int(i) for i in bad[0])
        raise ValueError(
            f"{where}: token id {int(array[position])} at position {position} is outside "
            f"[0, {vocab_size}); the tokenizer and the model's vocab_size={vocab_size} disagree."
        )


def epoch_rng(seed: int, epoch: int) -> np.random.Generator:
    """The random generator for one epoch: a function of (seed, epoch) only.

    Args:
        seed: non-negative run seed.
        epoch: non-negative epoch number.

    Returns:
        A fresh numpy Generator seeded with [seed, epoch].
    """
    if seed < 0 or epoch < 0:
        raise ValueError(f"seed={seed} and epoch={epoch} must be non-negative.")
    return np.random.default_rng([seed, epoch])


class EpochStream(Generic[T]):
    """An endless stream of items (batches), reshuffled every epoch, resumable exactly.

    Epoch e's items are `build_epoch(epoch_rng(seed, e))`, so they depend only on the seed
    and the epoch. The state is {'epoch': e, 'position': p}: the next item is item p of epoch
    e. Restoring a saved state (e.g. from JSON) continues the stream exactly where it stopped.
    """

    def __init__(
        self,
        build_epoch: Callable[[np.random.Generator], Sequence[T]],
        *,
        seed: int,
        state: Mapping[str, int] | None = None,
    ):
        """Creates the stream.

        Args:
            build_epoch: makes one epoch's items from its generator; must be deterministic.
            seed: non-negative run seed.
            state: a `state_dict()` saved earlier; None starts at epoch 0, position 0.
        """
        self._build_epoch = build_epoch
        self._seed = seed
        self._epoch = 0
        self._position = 0
        self._items: Sequence[T] | None = None
        if state is not None:
            self.load_state_dict(state)

    def state_dict(self) -> dict[str, int]:
        """The position of the next item: {'epoch': int, 'position': int}."""
        return {"epoch": self._epoch, "position": self._position}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        """Moves the stream to a saved position.

        Args:
            state: {'epoch': e, 'position': p} with e, p non-negative integers.

        Raises:
            ValueError: the state is malformed.
        """
        epoch, position = state.get("epoch"), state.get("position")
        if set(state) != {"epoch", "position"} or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (epoch, position)
        ):
            raise ValueError(
                f"Stream state {dict(state)} must be {{'epoch': int >= 0, 'position': int >= 0}} "
                "as written by EpochStream.state_dict(); delete the saved state to start over."
            )
        self._epoch, self._position, self._items = epoch, position, None

    @property
    def epoch(self) -> int:
        """The epoch the next item comes from."""
        return self._epoch

    def __iter__(self) -> Iterator[T]:
        return self

    def __next__(self) -> T:
        if self._items is None:
            self._items = self._build_epoch(epoch_rng(self._seed, self._epoch))
            if not self._items:
                raise ValueError(
                    f"Epoch {self._epoch} has no items: the data set is empty or every batch "
                    "was dropped (check drop_remainder and the batch size)."
                )
        if self._position >= len(self._items):
            if self._position > len(self._items):
                raise ValueError(
                    f"Stream state position={self._position} is past the end of epoch "
                    f"{self._epoch} ({len(self._items)} items): the data or batching changed "
                    "since the state was saved; delete the saved state to start over."
                )
            self._epoch, self._position = self._epoch + 1, 0
            self._items = None
            return next(self)
        item = self._items[self._position]
        self._position += 1
        return item
