"""The packers, one per `config.packing` value, and the packed batches they build.

- 'none' (`Bucketing`): one example per row, rows bucketed by length (`train.data.batching`).
- 'segments' (`Segments`): several whole examples per row, told apart by segment ids.
- 'stream' (`Stream`, one-sided tasks: the language model): the examples laid end to end
  in one token stream, cut into windows; attention crosses their boundaries.
`get_packer(config.packing)` finds the run's packer; each builds batches for any task from
the task's sides (`Task.sides`) and its examples' tokens on each side (`Task.to_sides`).

Bucketing pads every example to its bucket's length; on the KJV -> WEB corpus a quarter of
the tokens a step processes are padding. Packing in segments lays examples end to end in rows
of a fixed length instead, and the models keep them apart: int segment ids `(B, L)` number
the examples of a row 1, 2, ... (0 at padding), attention stays within a segment (self- and
cross-attention), and positions restart at 0 in each segment
(`flax_transformer.functional.segment_positions`, computed by the models). Each example
therefore gets the logits and loss it would get alone in a row; its labels are shifted
within its own segment, so no token is trained to predict the next example's first one.

A packed batch holds every side's token keys (as in `train.data.batching`) and, per side, its
segment ids (B, L) int32:
- translation: `src`, `tgt_in` (BOS + target ids), `tgt_out` (target ids + EOS), then
  `src_segment_ids` and `tgt_segment_ids`; an example's source and target have the same id.
- language modelling: `inputs` (BOS + ids), `targets` (ids + EOS), `segment_ids`.
- a conversation (`batching.MaskedTokens`): `inputs` (its ids but the last), `targets` (the
  next token where its mask trains it, the pad id elsewhere), `segment_ids`: each keeps its
  own mask in a row.
All batches have one shape, so the training step compiles once.

Rows are filled by first-fit decreasing (longest example first, each into the first row
with room on every side) within windows of `PACKING_WINDOW` shuffled examples: near-optimal
fill at a cost linear in the corpus (a KJV -> WEB epoch in rows of 96 tokens: 98.6% of the
target and 96.0% of the source slots hold tokens, against 77% and 75% when bucketed; about
0.5 s). The rows are then shuffled and cut into batches, so a batch's examples are a random
draw whatever their lengths.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from train.data.batching import (
    WHOLE_BATCH,
    Batch,
    RowShare,
    Side,
    SideTokens,
    bucketed_batches,
    default_bucket_lengths,
    fill_rows,
    rows_per_batch,
    slots_NK,
)
from train.data.tokenizer import PAD_ID

if TYPE_CHECKING:
    from train.config.sections import DataConfig

# Examples packed together. First-fit decreasing compares each example with every row of
# its window, so the cost grows with the window; 4096 loses < 0.1% fill against packing the
# whole KJV -> WEB epoch (45k examples) at once.
PACKING_WINDOW = 4096


def pack_rows(
    sizes_NK: np.ndarray,
    capacity_K: Sequence[int],
    order_N: np.ndarray,
    window: int = PACKING_WINDOW,
) -> list[np.ndarray]:
    """Groups examples into rows that hold them, first-fit decreasing within windows.

    Args:
        sizes_NK: int `(N, K)` slots each example needs on each of the K sides of a row
            (translation: source and target; language modelling: one side).
        capacity_K: the slots of a row on each side.
        order_N: the examples in the order they are taken, a permutation of range(N);
            windows are consecutive runs of it, and equal sizes keep this order.
        window: examples packed together.

    Returns:
        The rows, window by window, each an int array of example indices (longest first).

    Raises:
        ValueError: an example needs more slots than a row has (names it).
    """
    sizes_NK = np.asarray(sizes_NK, dtype=np.int64)
    capacity_K = np.asarray(capacity_K, dtype=np.int64)
    if sizes_NK.ndim != 2 or sizes_NK.shape[1] != capacity_K.size or window < 1:
        raise ValueError(
            f"pack_rows needs sizes (N, {capacity_K.size}) and window > 0, got "
            f"{sizes_NK.shape=}, {window=}."
        )
    too_big = np.flatnonzero((sizes_NK > capacity_K).any(axis=1))
    if too_big.size:
        raise ValueError(
            f"Example {too_big[0]} needs {sizes_NK[too_big[0]].tolist()} slots, more than a "
            f"packed row's {capacity_K.tolist()}; remove long examples first with "
            "batching.filter_by_length."
        )
    rows = []
    for start in range(0, len(order_N), window):
        chunk = np.asarray(order_N[start : start + window])
        chunk = chunk[np.argsort(-sizes_NK[chunk].max(axis=1), kind="stable")]
        # Free slots side by side (K, rows): one contiguous comparison per side.
        free_KR = np.empty((len(capacity_K), len(chunk)), np.int64)
        members: list[list[int]] = []
        for index in chunk:
            need_K = sizes_NK[index]
            fits_R = free_KR[0, : len(members)] >= need_K[0]
            for side in range(1, len(need_K)):
                fits_R &= free_KR[side, : len(members)] >= need_K[side]
            row = int(fits_R.argmax()) if len(members) else 0
            if len(members) and fits_R[row]:
                free_KR[:, row] -= need_K
                members[row].append(index)
            else:
                free_KR[:, len(members)] = capacity_K - need_K
                members.append([index])
        rows += [np.asarray(row, dtype=np.int64) for row in members]
    return rows


def _fill_packed(
    rows: int, length: int, per_row: Sequence[Sequence[Sequence[int]]], pad_id: int = PAD_ID
):
    """`(rows, length)` tokens (`pad_id` where none) and segment ids of rows holding the
    `per_row` sequences (each row at least one), laid out with one scatter rather than a
    slice per sequence."""
    tokens = np.full((rows, length), pad_id, dtype=np.int32)
    segments = np.zeros((rows, length), dtype=np.int32)
    ids = [sequence for row in per_row for sequence in row]
    if not ids:
        return tokens, segments
    lengths = np.fromiter(map(len, ids), np.int64, len(ids))
    counts = np.fromiter(map(len, per_row), np.int64, len(per_row))
    example_start = np.cumsum(lengths) - lengths  # in the concatenation of all examples
    first_example = np.cumsum(counts) - counts  # of each row
    example_row = np.repeat(np.arange(len(per_row)), counts)
    example_segment = np.arange(len(ids)) - first_example[example_row] + 1
    token_example = np.repeat(np.arange(len(ids)), lengths)
    token_row = example_row[token_example]
    token_column = np.arange(lengths.sum()) - example_start[first_example][token_row]
    tokens[token_row, token_column] = np.fromiter(
        itertools.chain.from_iterable(ids), np.int32, lengths.sum()
    )
    segments[token_row, token_column] = example_segment[token_example]
    return tokens, segments


def packed_plan(
    sizes_NK: np.ndarray,
    capacity_K: Sequence[int],
    batch_rows: int,
    rng: np.random.Generator | None,
    drop_remainder: bool,
    share: RowShare,
) -> list[list[np.ndarray]]:
    """This share's rows (example indices) of every batch, in batch order: the examples
    shuffled by `rng` (None: in order), packed (`pack_rows`), the rows shuffled, cut into
    batches of `batch_rows`. A function of the sizes and the generator alone, so a reader
    that holds only the sizes (a token store's) plans the batches `segment_batches` builds."""
    num_examples = len(sizes_NK)
    order = rng.permutation(num_examples) if rng is not None else np.arange(num_examples)
    rows = pack_rows(sizes_NK, capacity_K, order)
    if rng is not None:
        rows = [rows[i] for i in rng.permutation(len(rows))]
    part = share.rows(batch_rows)
    plan = []
    for start in range(0, len(rows), batch_rows):
        if len(rows) - start < batch_rows and drop_remainder:
            break
        plan.append(rows[start + part.start : start + part.stop])
    return plan


def segment_batches(
    sides: Sequence[Side],
    examples: Sequence[SideTokens],
    *,
    length: int,
    batch_size: int | None = None,
    tokens_per_batch: int | None = None,
    batch_size_multiple: int = 1,
    rng: np.random.Generator | None = None,
    drop_remainder: bool = False,
    share: RowShare = WHOLE_BATCH,
    pad_id: int = PAD_ID,
) -> list[Batch]:
    """Packed batches: rows of `length` slots on every side, each holding whole examples
    (`config.packing='segments'`).

    Args:
        sides: the task's sides (`Task.sides`).
        examples: each example's tokens per side (`Task.to_sides`); an example takes
            `Side.slots` slots on each side, and must fit a row.
        length: L, the slots of a row on each side (at most the model's max_len).
        batch_size: rows B per batch; or
        tokens_per_batch: B = tokens_per_batch // L (at least batch_size_multiple).
        batch_size_multiple: B is a multiple of this (the number of data-parallel devices).
        rng: shuffles the examples before packing and the rows after (use
            `epoch_stream.epoch_rng`); None keeps input order.
        drop_remainder: drop the last, partly filled batch instead of padding it with empty
            rows (its examples are then not seen this epoch).
        share: the rows of each batch to build (this process's part); the plan is the same
            for every share.
        pad_id: the tokenizer's pad id, in every slot without a token.

    Returns:
        Batches of every side's token keys and then its segment ids, each int32 (B, L)
        (B / share.count rows of the share); every example is in exactly one batch unless
        drop_remainder drops the last.
    """
    (rows,) = rows_per_batch([length], batch_size, tokens_per_batch, batch_size_multiple)
    sizes_NK = slots_NK(sides, examples)
    plan = packed_plan(sizes_NK, (length,) * len(sides), rows, rng, drop_remainder, share)
    part = share.rows(rows)
    rows = part.stop - part.start
    return [packed_batch(sides, members, examples, rows, length, pad_id) for members in plan]


def packed_batch(
    sides: Sequence[Side],
    members: Sequence[np.ndarray],
    examples,
    rows: int,
    length: int,
    pad_id: int = PAD_ID,
) -> Batch:
    """One packed batch: `rows` rows of `length` slots, row r holding the examples
    `members[r]` (rows past `members` empty).

    Args:
        sides: the task's sides.
        members: each row's example indices (a `packed_plan` batch).
        examples: anything indexable by those indices that gives an example's tokens per
            side (a list of `Task.to_sides`, or a token store's conversations read on demand).
        rows, length: the batch's shape (this share's rows).
        pad_id: the tokenizer's pad id.

    Returns:
        Every side's token keys and then its segment ids, each int32 (rows, length).
    """
    tokens, segments = {}, {}
    chosen = {i: examples[i] for row in members for i in row}
    for s, side in enumerate(sides):
        per_row = [[side.sequences(chosen[i][s], pad_id) for i in row] for row in members]
        for key in side.keys:
            tokens[key], segments[side.segment_key] = _fill_packed(
                rows, length, [[x[key] for x in row] for row in per_row], pad_id
            )
    return {**tokens, **segments}


def stream_batches(
    sides: Sequence[Side],
    examples: Sequence[SideTokens],
    *,
    seq_len: int,
    batch_size: int,
    rng: np.random.Generator | None = None,
    drop_remainder: bool = False,
    share: RowShare = WHOLE_BATCH,
    pad_id: int = PAD_ID,
) -> list[Batch]:
    """Concatenates the examples into one stream and cuts it into (B, T) windows: no padding
    except at the very end, so every token trains (`config.packing='stream'`). Attention
    crosses example boundaries (as in GPT training); BOS/EOS mark them.

    Args:
        sides: the task's one side, with labels (a language model's document).
        examples: each example's tokens (BOS + ids + EOS), as one-side `Task.to_sides`.
        seq_len: T, tokens per row.
        batch_size: B, rows per batch.
        rng: shuffles example order before packing and batch order after; None keeps order.
        drop_remainder: drop the last, partly filled window and batch instead of padding.
        share: the rows of each batch to build (this process's part).
        pad_id: the tokenizer's pad id, after the stream's end.

    Returns:
        Batches of the side's two keys (`inputs`, `targets`), each int32 (B, T)
        (B / share.count rows of the share); targets are inputs shifted by one within the
        stream, so window k's last target is window k+1's first input.

    Raises:
        ValueError: a non-positive seq_len or batch_size, or sides other than one with labels.
    """
    if len(sides) != 1 or sides[0].labels_key is None:
        raise ValueError(
            f"A stream is cut from one side with labels, not {sides}; pack with "
            "packing='segments' or 'none'."
        )
    if seq_len < 1 or batch_size < 1:
        raise ValueError(f"seq_len={seq_len} and batch_size={batch_size} must be positive.")
    order = rng.permutation(len(examples)) if rng is not None else range(len(examples))
    pieces = [np.asarray(examples[i][0], dtype=np.int32) for i in order]
    stream = np.concatenate(pieces) if pieces else np.zeros((0,), np.int32)
    # Window k covers stream[k*T : k*T + T + 1]: T inputs, and T targets one step later.
    num_windows = max(len(stream) - 1, 0) // seq_len
    if not drop_remainder and (len(stream) - 1) % seq_len:
        num_windows += 1
    padded = np.full((num_windows * seq_len + 1,), pad_id, dtype=np.int32)
    used = min(len(stream), padded.size)
    padded[:used] = stream[:used]
    windows = sides[0].sequences(padded)
    windows = {key: value.reshape(num_windows, seq_len) for key, value in windows.items()}
    part = share.rows(batch_size)
    batches = []
    for start in range(0, num_windows, batch_size):
        if num_windows - start < batch_size and drop_remainder:
            break
        rows = slice(start + part.start, min(start + part.stop, num_windows))
        batches.append(
            {
                key: fill_rows(part.stop - part.start, seq_len, value[rows], pad_id)
                for key, value in windows.items()
            }
        )
    if rng is not None:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    return batches


class Packer:
    """How the examples of a task become batches for one `config.packing` value.

    Attributes:
        name: the `config.packing` value.
        whole_examples: whether a row holds whole examples, so that those longer than
            `max_len` must be dropped first (a stream cuts examples of any length).
        streams: whether the examples are one stream cut into windows, whose first token
            alone is no label (else each example's first token is none): to count
            validation characters per label.
    """

    name: str
    whole_examples: bool = True
    streams: bool = False

    def check(self, data: DataConfig, num_devices: int, share: RowShare):
        """Raises ValueError, before any data is read, for rows that cannot be split over
        the `num_devices` devices or `share.count` processes."""
        if data.batch_size and data.batch_size % share.count:
            raise ValueError(
                f"--config.batch_size={data.batch_size}: must be a multiple of the "
                f"{share.count} processes the batch is split over."
            )

    def batches(
        self,
        data: DataConfig,
        sides: Sequence[Side],
        examples: Sequence[SideTokens],
        rng: np.random.Generator | None,
        num_devices: int,
        share: RowShare = WHOLE_BATCH,
        *,
        evaluation: bool = False,
        pad_id: int = PAD_ID,
    ) -> list[Batch]:
        """Batches of the examples as the data section says; only `share`'s rows are built.

        Args:
            data: the data section (max_len, bucket_lengths, batch_size, tokens_per_batch).
            sides, examples: the task's sides and each example's tokens on them.
            rng: the epoch's generator (`epoch_stream.epoch_rng`); None keeps input order.
            num_devices: every batch's row count is a multiple of it.
            share: this process's rows of every batch.
            evaluation: validation batches (fixed order) rather than training ones.
            pad_id: the tokenizer's pad id.
        """
        raise NotImplementedError


class Bucketing(Packer):
    """'none': one example per row, rows bucketed by length (`batching.bucketed_batches`)."""

    name = "none"

    def batches(
        self,
        data,
        sides,
        examples,
        rng,
        num_devices,
        share=WHOLE_BATCH,
        *,
        evaluation=False,
        pad_id=PAD_ID,
    ):
        del evaluation  # the same batches either way
        return bucketed_batches(
            sides,
            examples,
            bucket_lengths=data.bucket_lengths or default_bucket_lengths(data.max_len),
            rng=rng,
            share=share,
            pad_id=pad_id,
            **_rows(data, num_devices),
        )


class Segments(Packer):
    """'segments': whole examples packed into rows of max_len (`segment_batches`).

    Validation batches stay one example per row, so their loss is the unpacked one by
    construction (packing gives the same per example).
    """

    name = "segments"

    def batches(
        self,
        data,
        sides,
        examples,
        rng,
        num_devices,
        share=WHOLE_BATCH,
        *,
        evaluation=False,
        pad_id=PAD_ID,
    ):
        if evaluation:
            return PACKERS["none"].batches(
                data, sides, examples, rng, num_devices, share, pad_id=pad_id
            )
        return segment_batches(
            sides,
            examples,
            length=data.max_len,
            rng=rng,
            share=share,
            pad_id=pad_id,
            **_rows(data, num_devices),
        )


class Stream(Packer):
    """'stream': examples concatenated and cut into max_len windows (`stream_batches`),
    validation too (its examples need not fit max_len)."""

    name = "stream"
    whole_examples = False
    streams = True

    def check(self, data, num_devices, share):
        if data.batch_size % num_devices:
            raise ValueError(
                f"--config.batch_size={data.batch_size}: must be a multiple of the "
                f"{num_devices} devices the batch is split over."
            )
        super().check(data, num_devices, share)

    def batches(
        self,
        data,
        sides,
        examples,
        rng,
        num_devices,
        share=WHOLE_BATCH,
        *,
        evaluation=False,
        pad_id=PAD_ID,
    ):
        del num_devices, evaluation  # check() saw to the devices; validation streams too
        return stream_batches(
            sides,
            examples,
            seq_len=data.max_len,
            batch_size=data.batch_size,
            rng=rng,
            share=share,
            pad_id=pad_id,
        )


def _rows(data: DataConfig, num_devices: int) -> dict:
    """The row-count arguments of bucketed and segment batches, as the data section sets
    them."""
    return dict(
        batch_size=data.batch_size or None,
        tokens_per_batch=data.tokens_per_batch or None,
        batch_size_multiple=num_devices,
    )


PACKERS: dict[str, Packer] = {p.name: p for p in (Bucketing(), Segments(), Stream())}


def get_packer(name: str) -> Packer:
    """The packer of a `config.packing` value.

    Raises:
        ValueError: no packer has that name (names the choices).
    """
    if name not in PACKERS:
        raise ValueError(f"packing={name!r} is not one of {tuple(PACKERS)}.")
    return PACKERS[name]
