"""Packing in segments (`config.packing='segments'`): whole examples laid end to end in rows
of a fixed length, told apart by segment ids; the plan of an epoch's rows (`packed_plan`) and
the batches built from it (`segment_batches`, `packed_batch`).

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

import numpy as np

from train.data.batching import (
    WHOLE_BATCH,
    Batch,
    RowShare,
    Side,
    SideTokens,
    rows_per_batch,
    slots_NK,
)
from train.data.tokenizer import PAD_ID

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
