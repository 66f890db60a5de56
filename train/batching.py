"""Token ids -> fixed-shape numpy batches, bucketed by length so `jit` compiles few shapes.

Every batch is a dict of int32 arrays padded with PAD_ID (0):
- translation: `src` (B, L) the source ids; `tgt_in` (B, L) BOS + target ids (decoder input);
  `tgt_out` (B, L) target ids + EOS (labels). Source and target share the bucket length L.
- language modelling: `inputs` (B, L) and `targets` (B, L), the document BOS + ids + EOS
  shifted by one.
A batch's L is one of a few bucket lengths and its B is fixed per bucket, so the training step
compiles once per bucket. Rows past the data are all padding (the loss masks them).

In a run of several processes each one builds only its `RowShare` of every batch: the plan
(which examples go into which batch, in which order) is the same in every process, so part p
of P is rows [p*B/P, (p+1)*B/P) of the batch a single process would build.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from train.tokenizer import BOS_ID, EOS_ID, PAD_ID

# Shortest default bucket: below this, bucketing saves less than it costs in compiles.
MIN_BUCKET_LENGTH = 8
ON_TOO_LONG = ("drop", "error")

Batch = dict[str, np.ndarray]
Pair = tuple[Sequence[int], Sequence[int]]


@dataclasses.dataclass(frozen=True)
class RowShare:
    """Part `index` of `count` equal, contiguous row ranges of every batch (one process's).

    The default (0, 1) is the whole batch.
    """

    index: int = 0
    count: int = 1

    def __post_init__(self):
        if not 0 <= self.index < self.count:
            raise ValueError(f"RowShare index={self.index} must be in [0, count={self.count}).")

    def rows(self, batch_rows: int) -> slice:
        """The rows of a `batch_rows`-row global batch in this share.

        Raises:
            ValueError: `batch_rows` does not divide into `count` equal parts.
        """
        if batch_rows % self.count:
            raise ValueError(
                f"A batch of {batch_rows} rows does not split evenly over {self.count} "
                "processes; make the batch size a multiple of the number of processes."
            )
        part = batch_rows // self.count
        return slice(self.index * part, (self.index + 1) * part)


# The share of a single-process run: every row.
WHOLE_BATCH = RowShare()


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


def pair_length(pair: Pair) -> int:
    """Padded length a (src_ids, tgt_ids) pair needs (no BOS/EOS in the ids): the longer of
    the source and BOS + target."""
    src, tgt = pair
    return max(len(src), len(tgt) + 1)


def document_length(ids: Sequence[int]) -> int:
    """Padded length a language-model document needs (no BOS/EOS in the ids): BOS + ids."""
    return len(ids) + 1


def filter_by_length(
    examples: Sequence,
    max_len: int,
    length: Callable[[Any], int],
    on_too_long: str = "drop",
) -> tuple[list, int]:
    """Removes examples longer than `max_len`, or raises; never clips.

    Args:
        examples: (src_ids, tgt_ids) pairs or id lists.
        max_len: longest padded length allowed.
        length: an example's padded length (`pair_length`, `document_length`).
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


def _batch_sizes(
    bucket_lengths: Sequence[int],
    batch_size: int | None,
    tokens_per_batch: int | None,
    batch_size_multiple: int,
) -> list[int]:
    """Rows per batch for each bucket: fixed, or as many as fit tokens_per_batch."""
    if (batch_size is None) == (tokens_per_batch is None):
        raise ValueError(
            f"Pass exactly one of batch_size={batch_size} and tokens_per_batch={tokens_per_batch}."
        )
    if batch_size_multiple < 1:
        raise ValueError(f"batch_size_multiple={batch_size_multiple} must be positive.")
    if batch_size is not None:
        if batch_size < 1 or batch_size % batch_size_multiple:
            raise ValueError(
                f"batch_size={batch_size} must be a positive multiple of "
                f"batch_size_multiple={batch_size_multiple} (e.g. the device count)."
            )
        return [batch_size] * len(bucket_lengths)
    sizes = []
    for length in bucket_lengths:
        rows = tokens_per_batch // length // batch_size_multiple * batch_size_multiple
        sizes.append(max(rows, batch_size_multiple))
    return sizes


def _plan(lengths, bucket_lengths, batch_sizes, rng, drop_remainder):
    """Groups example indices into batches: list of (bucket length, index array)."""
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


def _fill(rows: int, length: int, sequences) -> np.ndarray:
    """Stacks sequences into a zero-padded (rows, length) int32 array."""
    out = np.full((rows, length), PAD_ID, dtype=np.int32)
    for row, sequence in enumerate(sequences):
        out[row, : len(sequence)] = sequence
    return out


def translation_batches(
    pairs: Sequence[Pair],
    *,
    bucket_lengths: Sequence[int],
    batch_size: int | None = None,
    tokens_per_batch: int | None = None,
    batch_size_multiple: int = 1,
    rng: np.random.Generator | None = None,
    drop_remainder: bool = False,
    bos_id: int = BOS_ID,
    eos_id: int = EOS_ID,
    share: RowShare = WHOLE_BATCH,
) -> list[Batch]:
    """Bucketed, padded batches for an encoder-decoder.

    Args:
        pairs: (src_ids, tgt_ids) without BOS/EOS, each fitting the largest bucket.
        bucket_lengths: increasing lengths L; an example goes to the first that fits it.
        batch_size: rows B per batch for every bucket; or
        tokens_per_batch: B = tokens_per_batch // L per bucket (at least batch_size_multiple).
        batch_size_multiple: B is a multiple of this (the number of data-parallel devices).
        rng: shuffles examples and batch order (use `input_pipeline.epoch_rng`); None keeps
            input order with buckets ascending, for evaluation.
        drop_remainder: drop each bucket's last, partly filled batch instead of padding it.
        bos_id: prepended to `tgt_in`.
        eos_id: appended to `tgt_out`.
        share: the rows of each batch to build (this process's part); the plan is the same
            for every share.

    Returns:
        Batches {'src', 'tgt_in', 'tgt_out'}, each int32 (B, L) (B / share.count rows of
        the share).
    """
    lengths = [pair_length(pair) for pair in pairs]
    sizes = _batch_sizes(bucket_lengths, batch_size, tokens_per_batch, batch_size_multiple)
    batches = []
    for length, global_rows, members in _plan(lengths, bucket_lengths, sizes, rng, drop_remainder):
        part = share.rows(global_rows)
        rows = part.stop - part.start
        chosen = [pairs[i] for i in members[part]]
        batches.append(
            {
                "src": _fill(rows, length, [src for src, _ in chosen]),
                "tgt_in": _fill(rows, length, [[bos_id, *tgt] for _, tgt in chosen]),
                "tgt_out": _fill(rows, length, [[*tgt, eos_id] for _, tgt in chosen]),
            }
        )
    return batches


def _lm_batch(rows: int, length: int, documents) -> Batch:
    """inputs/targets for documents already holding BOS ... EOS (length <= length + 1)."""
    return {
        "inputs": _fill(rows, length, [doc[:-1] for doc in documents]),
        "targets": _fill(rows, length, [doc[1:] for doc in documents]),
    }


def lm_batches(
    sequences: Sequence[Sequence[int]],
    *,
    bucket_lengths: Sequence[int],
    batch_size: int | None = None,
    tokens_per_batch: int | None = None,
    batch_size_multiple: int = 1,
    rng: np.random.Generator | None = None,
    drop_remainder: bool = False,
    bos_id: int = BOS_ID,
    eos_id: int = EOS_ID,
    share: RowShare = WHOLE_BATCH,
) -> list[Batch]:
    """Bucketed, padded language-model batches, one document (e.g. a line) per row.

    Args:
        sequences: documents' ids without BOS/EOS, each fitting the largest bucket; a
            document becomes BOS + ids + EOS, so `inputs` starts with BOS and `targets` ends
            with EOS.
        bucket_lengths, batch_size, tokens_per_batch, batch_size_multiple, rng,
        drop_remainder, bos_id, eos_id, share: as in `translation_batches`.

    Returns:
        Batches {'inputs', 'targets'}, each int32 (B, L) (B / share.count rows of the share).
    """
    lengths = [document_length(sequence) for sequence in sequences]
    sizes = _batch_sizes(bucket_lengths, batch_size, tokens_per_batch, batch_size_multiple)
    plan = _plan(lengths, bucket_lengths, sizes, rng, drop_remainder)
    batches = []
    for length, global_rows, members in plan:
        part = share.rows(global_rows)
        documents = [[bos_id, *sequences[i], eos_id] for i in members[part]]
        batches.append(_lm_batch(part.stop - part.start, length, documents))
    return batches


def packed_lm_batches(
    sequences: Sequence[Sequence[int]],
    *,
    seq_len: int,
    batch_size: int,
    rng: np.random.Generator | None = None,
    drop_remainder: bool = False,
    bos_id: int = BOS_ID,
    eos_id: int = EOS_ID,
    share: RowShare = WHOLE_BATCH,
) -> list[Batch]:
    """Concatenates documents into one stream and cuts it into (B, T) windows: no padding
    except at the very end, so every token trains. Attention crosses document boundaries
    (as in GPT training); BOS/EOS mark them.

    Args:
        sequences: documents' ids without BOS/EOS; the stream is BOS + doc + EOS per document.
        seq_len: T, tokens per row.
        batch_size: B, rows per batch.
        rng: shuffles document order before packing and batch order after; None keeps order.
        drop_remainder: drop the last, partly filled window and batch instead of padding.
        bos_id: starts each document.
        eos_id: ends each document.
        share: the rows of each batch to build (this process's part).

    Returns:
        Batches {'inputs', 'targets'}, each int32 (B, T) (B / share.count rows of the
        share); targets are inputs shifted by one within the stream, so window k's last
        target is window k+1's first input.
    """
    if seq_len < 1 or batch_size < 1:
        raise ValueError(f"seq_len={seq_len} and batch_size={batch_size} must be positive.")
    order = rng.permutation(len(sequences)) if rng is not None else range(len(sequences))
    pieces = [np.asarray([bos_id, *sequences[i], eos_id], dtype=np.int32) for i in order]
    stream = np.concatenate(pieces) if pieces else np.zeros((0,), np.int32)
    # Window k covers stream[k*T : k*T + T + 1]: T inputs, and T targets one step later.
    num_windows = max(len(stream) - 1, 0) // seq_len
    if not drop_remainder and (len(stream) - 1) % seq_len:
        num_windows += 1
    padded = np.full((num_windows * seq_len + 1,), PAD_ID, dtype=np.int32)
    used = min(len(stream), padded.size)
    padded[:used] = stream[:used]
    inputs = padded[:-1].reshape(num_windows, seq_len)
    targets = padded[1:].reshape(num_windows, seq_len)
    part = share.rows(batch_size)
    batches = []
    for start in range(0, num_windows, batch_size):
        if num_windows - start < batch_size and drop_remainder:
            break
        rows = slice(start + part.start, min(start + part.stop, num_windows))
        batches.append(
            {
                "inputs": _fill(part.stop - part.start, seq_len, inputs[rows]),
                "targets": _fill(part.stop - part.start, seq_len, targets[rows]),
            }
        )
    if rng is not None:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    return batches
