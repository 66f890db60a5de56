"""Packed batches: several whole examples per row, told apart by segment ids.

Bucketing (`train.batching`) pads every example to its bucket's length; on the KJV -> WEB
corpus a quarter of the tokens a step processes are padding. Packing lays examples end to
end in rows of a fixed length instead, and the models keep them apart: int segment ids
`(B, L)` number the examples of a row 1, 2, ... (0 at padding), attention stays within a
segment (self- and cross-attention), and positions restart at 0 in each segment
(`flax_transformer.functional.segment_positions`, computed by the models). Each example
therefore gets the logits and loss it would get alone in a row; its labels are shifted
within its own segment, so no token is trained to predict the next example's first one.

Every batch is a dict of int32 arrays padded with PAD_ID (0):
- translation: `src`, `src_segment_ids` (B, S); `tgt_in` (BOS + target ids), `tgt_out`
  (target ids + EOS), `tgt_segment_ids` (B, T). An example's source and target have the
  same segment id.
- language modelling: `inputs` (BOS + ids), `targets` (ids + EOS), `segment_ids` (B, L).
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
from collections.abc import Callable, Sequence

import numpy as np

from train.batching import WHOLE_BATCH, Batch, Pair, RowShare, _batch_sizes
from train.tokenizer import BOS_ID, EOS_ID, PAD_ID

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


def _fill_packed(rows: int, length: int, members, sequence: Callable[[int], Sequence[int]]):
    """`(rows, length)` tokens and segment ids of rows holding the `members` examples (each
    row at least one), laid out with one scatter rather than a slice per example."""
    tokens = np.full((rows, length), PAD_ID, dtype=np.int32)
    segments = np.zeros((rows, length), dtype=np.int32)
    ids = [sequence(index) for row in members for index in row]
    if not ids:
        return tokens, segments
    lengths = np.fromiter(map(len, ids), np.int64, len(ids))
    per_row = np.fromiter(map(len, members), np.int64, len(members))
    example_start = np.cumsum(lengths) - lengths  # in the concatenation of all examples
    first_example = np.cumsum(per_row) - per_row  # of each row
    example_row = np.repeat(np.arange(len(members)), per_row)
    example_segment = np.arange(len(ids)) - first_example[example_row] + 1
    token_example = np.repeat(np.arange(len(ids)), lengths)
    token_row = example_row[token_example]
    token_column = np.arange(lengths.sum()) - example_start[first_example][token_row]
    tokens[token_row, token_column] = np.fromiter(
        itertools.chain.from_iterable(ids), np.int32, lengths.sum()
    )
    segments[token_row, token_column] = example_segment[token_example]
    return tokens, segments


def _plan(
    sizes_NK: np.ndarray,
    capacity_K: Sequence[int],
    batch_rows: int,
    rng: np.random.Generator | None,
    drop_remainder: bool,
    share: RowShare,
) -> list[list[np.ndarray]]:
    """This share's rows (example indices) of every batch, in batch order."""
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


def packed_translation_batches(
    pairs: Sequence[Pair],
    *,
    src_length: int,
    tgt_length: int,
    batch_size: int | None = None,
    tokens_per_batch: int | None = None,
    batch_size_multiple: int = 1,
    rng: np.random.Generator | None = None,
    drop_remainder: bool = False,
    bos_id: int = BOS_ID,
    eos_id: int = EOS_ID,
    share: RowShare = WHOLE_BATCH,
) -> list[Batch]:
    """Packed batches for an encoder-decoder: rows of `src_length` source and `tgt_length`
    target slots, each holding whole examples.

    Args:
        pairs: (src_ids, tgt_ids) without BOS/EOS; an example takes len(src) source slots
            and len(tgt) + 1 target slots (BOS + target in `tgt_in`, target + EOS in
            `tgt_out`), and must fit a row.
        src_length, tgt_length: S and T, the slots of a row (at most the model's max_len).
        batch_size: rows B per batch; or
        tokens_per_batch: B = tokens_per_batch // max(S, T) (at least batch_size_multiple).
        batch_size_multiple: B is a multiple of this (the number of data-parallel devices).
        rng: shuffles the examples before packing and the rows after (use
            `input_pipeline.epoch_rng`); None keeps input order.
        drop_remainder: drop the last, partly filled batch instead of padding it with empty
            rows (its examples are then not seen this epoch).
        bos_id, eos_id: start `tgt_in` and end `tgt_out` of each segment.
        share: the rows of each batch to build (this process's part); the plan is the same
            for every share.

    Returns:
        Batches {'src', 'src_segment_ids'} int32 (B, S) and {'tgt_in', 'tgt_out',
        'tgt_segment_ids'} int32 (B, T) (B / share.count rows of the share); every example
        is in exactly one batch unless drop_remainder drops the last.
    """
    (rows,) = _batch_sizes(
        [max(src_length, tgt_length)], batch_size, tokens_per_batch, batch_size_multiple
    )
    sizes_NK = np.asarray([(len(src), len(tgt) + 1) for src, tgt in pairs], np.int64)
    sizes_NK = sizes_NK.reshape(len(pairs), 2)
    plan = _plan(sizes_NK, (src_length, tgt_length), rows, rng, drop_remainder, share)
    part = share.rows(rows)
    rows = part.stop - part.start
    batches = []
    for members in plan:
        src, src_segments = _fill_packed(rows, src_length, members, lambda i: pairs[i][0])
        tgt_in, tgt_segments = _fill_packed(
            rows, tgt_length, members, lambda i: [bos_id, *pairs[i][1]]
        )
        tgt_out, _ = _fill_packed(rows, tgt_length, members, lambda i: [*pairs[i][1], eos_id])
        batches.append(
            {
                "src": src,
                "tgt_in": tgt_in,
                "tgt_out": tgt_out,
                "src_segment_ids": src_segments,
                "tgt_segment_ids": tgt_segments,
            }
        )
    return batches


def packed_document_batches(
    sequences: Sequence[Sequence[int]],
    *,
    seq_len: int,
    batch_size: int | None = None,
    tokens_per_batch: int | None = None,
    batch_size_multiple: int = 1,
    rng: np.random.Generator | None = None,
    drop_remainder: bool = False,
    bos_id: int = BOS_ID,
    eos_id: int = EOS_ID,
    share: RowShare = WHOLE_BATCH,
) -> list[Batch]:
    """Packed language-model batches: whole documents in rows of `seq_len` slots, attention
    kept within each (unlike `batching.packed_lm_batches`, which cuts one stream).

    Args:
        sequences: documents' ids without BOS/EOS; a document takes len(ids) + 1 slots
            (`inputs` BOS + ids, `targets` ids + EOS) and must fit a row.
        seq_len: L, the slots of a row (at most the model's max_len).
        batch_size, tokens_per_batch, batch_size_multiple, rng, drop_remainder, bos_id,
        eos_id, share: as in `packed_translation_batches` (B = tokens_per_batch // L).

    Returns:
        Batches {'inputs', 'targets', 'segment_ids'}, each int32 (B, L) (B / share.count rows
        of the share).
    """
    (rows,) = _batch_sizes([seq_len], batch_size, tokens_per_batch, batch_size_multiple)
    sizes_NK = np.asarray([len(ids) + 1 for ids in sequences], np.int64)[:, None]
    plan = _plan(sizes_NK, (seq_len,), rows, rng, drop_remainder, share)
    part = share.rows(rows)
    rows = part.stop - part.start
    batches = []
    for members in plan:
        inputs, segments = _fill_packed(rows, seq_len, members, lambda i: [bos_id, *sequences[i]])
        targets, _ = _fill_packed(rows, seq_len, members, lambda i: [*sequences[i], eos_id])
        batches.append({"inputs": inputs, "targets": targets, "segment_ids": segments})
    return batches
