"""Token ids -> fixed-shape numpy batches, bucketed by length so `jit` compiles few shapes.

An example reaches batching as the token ids of each of its sides (`Task.to_sides`): a
translation pair has a source side and a target side, a language-model document one side.
A `Side` names the batch keys it fills: a source fills `src` with its ids as they are; a
side with labels holds BOS + ids + EOS and fills its input key with all but the last token
and its labels key with all but the first, so that the labels are the inputs shifted by one:
- translation: `src` (B, L) the source ids; `tgt_in` (B, L) BOS + target ids (decoder input);
  `tgt_out` (B, L) target ids + EOS (labels). Source and target share the bucket length L.
- language modelling: `inputs` (B, L) BOS + ids and `targets` (B, L) ids + EOS.
- a conversation (`MaskedTokens`): its ids as the template wrote them, nothing added;
  `inputs` all but the last, `targets` all but the first where its mask trains that token
  and the pad id elsewhere, so the loss and the metrics count the trained tokens only.
Every array is int32, padded with the tokenizer's pad id (`pad_id`, PAD_ID = 0 for the
tokenizers trained here). A batch's L is one of a few bucket lengths and
its B is fixed per bucket, so the training step compiles once per bucket. Rows past the data
are all padding (the loss masks them). `train.data.packing` packs rows instead (and holds the
packer of every `config.packing` value, this bucketing among them).

In a run of several processes each one builds only its `RowShare` of every batch: the plan
(which examples go into which batch, in which order) is the same in every process, so part p
of P is rows [p*B/P, (p+1)*B/P) of the batch a single process would build.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from train.core.batch_rows import WHOLE_BATCH, RowShare, rows_per_batch  # noqa: F401
from train.data.tokenizer import PAD_ID

# Shortest default bucket: below this, bucketing saves less than it costs in compiles.
MIN_BUCKET_LENGTH = 8
ON_TOO_LONG = ("drop", "error")

Batch = dict[str, np.ndarray]
# An example's token ids on each of its sides, in the order of the task's `sides`.
SideTokens = tuple["Sequence[int] | MaskedTokens", ...]


@dataclasses.dataclass(frozen=True, eq=False)
class MaskedTokens:
    """A side's tokens that carry their own loss mask (a conversation: `train.data.chat.encoding`),
    taken as they are: no BOS or EOS is put around them.

    Attributes:
        ids: int `(T,)`, the whole sequence.
        trained: bool `(T,)`, True where the token is a label of the loss (the first
            token is never one: nothing precedes it).
    """

    ids: np.ndarray
    trained: np.ndarray

    def __post_init__(self):
        if np.shape(self.ids) != np.shape(self.trained) or np.ndim(self.ids) != 1:
            raise ValueError(
                f"MaskedTokens needs ids and trained of one shape (T,), got "
                f"{np.shape(self.ids)} and {np.shape(self.trained)}."
            )

    def __len__(self) -> int:
        return len(self.ids)


@dataclasses.dataclass(frozen=True)
class Side:
    """The batch keys that one side of an example fills.

    Attributes:
        key: the key of the side's tokens: all of them, or all but the last (the decoder's
            inputs) where the side has labels.
        labels_key: the key of the labels (the tokens but the first), or None for a side
            that is only read (a translation source).
        segment_key: the key of the side's segment ids in a packed batch (`train.data.packing`).
    """

    key: str
    labels_key: str | None
    segment_key: str

    @property
    def keys(self) -> tuple[str, ...]:
        """The side's token keys: its tokens' key, then its labels' key if it has one."""
        return (self.key,) if self.labels_key is None else (self.key, self.labels_key)

    def slots(self, tokens: Sequence[int]) -> int:
        """The row slots the side's tokens take: one fewer than the tokens with labels."""
        return len(tokens) - (self.labels_key is not None)

    def sequences(
        self, tokens: Sequence[int] | MaskedTokens, pad_id: int = PAD_ID
    ) -> dict[str, Sequence[int]]:
        """What goes into each of the side's token keys: the labels are the tokens shifted
        by one, and `pad_id` (no label) where `MaskedTokens` trains no token."""
        if isinstance(tokens, MaskedTokens):
            if self.labels_key is None:
                raise ValueError(f"Side {self.key!r} has no labels for a loss mask to select.")
            labels = np.where(tokens.trained[1:], tokens.ids[1:], pad_id)
            return {self.key: tokens.ids[:-1], self.labels_key: labels}
        if self.labels_key is None:
            return {self.key: tokens}
        return {self.key: tokens[:-1], self.labels_key: tokens[1:]}


def example_slots(sides: Sequence[Side], example: SideTokens) -> int:
    """The padded length an example needs: the slots of its longest side."""
    return max(side.slots(tokens) for side, tokens in zip(sides, example, strict=True))


def slots_NK(sides: Sequence[Side], examples: Sequence[SideTokens]) -> np.ndarray:
    """int64 `(N, K)`: the slots each of N examples takes on each of the K sides."""
    sizes_NK = np.empty((len(examples), len(sides)), np.int64)
    for k, side in enumerate(sides):
        lengths_N = np.fromiter((len(x[k]) for x in examples), np.int64, len(examples))
        sizes_NK[:, k] = lengths_N - (side.labels_key is not None)
    return sizes_NK


def default_bucket_lengths(max_len: int, min_len: int = MIN_BUCKET_LENGTH) -> tuple[int, ...]:
    """Powers of two from `min_len` below `max_len`, then `max_len` itself.

    Args:
        max_len: the longest sequence the model takes.
        min_len: the shortest bucket.

    Returns:
        Increasing bucket lengths ending with max_len, e.g. (8, 16, 32, 64, 100) for 100.
    """
    if max_len < 1:
        raise ValueError(f"max_len={max_len} must be positive.")
    lengths = []
    length = min_len
    while length < max_len:
        lengths.append(length)
        length *= 2
    return (*lengths, max_len)


def filter_by_length(
    examples: Sequence,
    max_len: int,
    length: Callable[[Any], int],
    on_too_long: str = "drop",
) -> tuple[list, int]:
    """Removes examples longer than `max_len`, or raises; never clips.

    Args:
        examples: tokenized examples of a task.
        max_len: longest padded length allowed.
        length: an example's padded length (`Task.example_length`).
        on_too_long: "drop" to remove them and report how many, "error" to raise.

    Returns:
        (kept examples in their order, number dropped): log a warning if the count is nonzero.

    Raises:
        ValueError: on_too_long="error" and an example is too long (names its index).
    """
    if on_too_long not in ON_TOO_LONG:
        raise ValueError(f"on_too_long={on_too_long!r} is not one of {ON_TOO_LONG}.")
    kept = []
    for index, example in enumerate(examples):
        needed = length(example)
        if needed <= max_len:
            kept.append(example)
        elif on_too_long == "error":
            raise ValueError(
                f"Example {index} needs length {needed} > max_len={max_len}; raise max_len or "
                "pass on_too_long='drop'."
            )
    return kept, len(examples) - len(kept)


def fill_rows(rows: int, length: int, sequences, pad_id: int = PAD_ID) -> np.ndarray:
    """Stacks sequences into a (rows, length) int32 array padded with `pad_id`."""
    out = np.full((rows, length), pad_id, dtype=np.int32)
    for row, sequence in enumerate(sequences):
        out[row, : len(sequence)] = sequence
    return out


def _plan(lengths, bucket_lengths, batch_sizes, rng, drop_remainder):
    """Groups example indices into batches: list of (bucket length, rows, index array)."""
    if (
        not bucket_lengths
        or list(bucket_lengths) != sorted(set(bucket_lengths))
        or (bucket_lengths[0] < 1)
    ):
        raise ValueError(f"bucket_lengths={bucket_lengths} must be positive and increasing.")
    lengths = np.asarray(lengths, dtype=np.int64)
    if lengths.size and lengths.max() > bucket_lengths[-1]:
        raise ValueError(
            f"An example needs length {lengths.max()} > the largest bucket {bucket_lengths[-1]}; "
            "remove long examples first with filter_by_length."
        )
    order = rng.permutation(lengths.size) if rng is not None else np.arange(lengths.size)
    bucket_of = np.searchsorted(np.asarray(bucket_lengths), lengths[order])
    plan = []
    for bucket, (length, rows) in enumerate(zip(bucket_lengths, batch_sizes, strict=True)):
        members = order[bucket_of == bucket]
        for start in range(0, members.size, rows):
            chunk = members[start : start + rows]
            if chunk.size == rows or not drop_remainder:
                plan.append((length, rows, chunk))
    if rng is not None:
        plan = [plan[i] for i in rng.permutation(len(plan))]
    return plan


def bucketed_batches(
    sides: Sequence[Side],
    examples: Sequence[SideTokens],
    *,
    bucket_lengths: Sequence[int],
    batch_size: int | None = None,
    tokens_per_batch: int | None = None,
    batch_size_multiple: int = 1,
    rng: np.random.Generator | None = None,
    drop_remainder: bool = False,
    share: RowShare = WHOLE_BATCH,
    pad_id: int = PAD_ID,
) -> list[Batch]:
    """Bucketed, padded batches, one example per row (`config.packing='none'`).

    Args:
        sides: the task's sides (`Task.sides`).
        examples: each example's tokens per side (`Task.to_sides`), each fitting the
            largest bucket (`example_slots`).
        bucket_lengths: increasing lengths L; an example goes to the first that fits it.
        batch_size: rows B per batch for every bucket; or
        tokens_per_batch: B = tokens_per_batch // L per bucket (at least batch_size_multiple).
        batch_size_multiple: B is a multiple of this (the number of data-parallel devices).
        rng: shuffles examples and batch order (use `epoch_stream.epoch_rng`); None keeps
            input order with buckets ascending, for evaluation.
        drop_remainder: drop each bucket's last, partly filled batch instead of padding it.
        share: the rows of each batch to build (this process's part); the plan is the same
            for every share.
        pad_id: the tokenizer's pad id, in every slot without a token.

    Returns:
        Batches holding every side's keys, each int32 (B, L) (B / share.count rows of the
        share).
    """
    lengths = slots_NK(sides, examples).max(axis=1, initial=0)
    sizes = rows_per_batch(bucket_lengths, batch_size, tokens_per_batch, batch_size_multiple)
    batches = []
    for length, global_rows, members in _plan(lengths, bucket_lengths, sizes, rng, drop_remainder):
        part = share.rows(global_rows)
        chosen = [examples[i] for i in members[part]]
        batch = {}
        for s, side in enumerate(sides):
            sequences = [side.sequences(example[s], pad_id) for example in chosen]
            for key in side.keys:
                batch[key] = fill_rows(
                    part.stop - part.start, length, [x[key] for x in sequences], pad_id
                )
        batches.append(batch)
    return batches
