"""Packing as a stream (`config.packing='stream'`, one-sided tasks: the language model): the
examples laid end to end in one token stream, cut into (B, T) windows; attention crosses their
boundaries (as in GPT training), and BOS/EOS mark them."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from train.data.batching import WHOLE_BATCH, Batch, RowShare, Side, SideTokens, fill_rows
from train.data.tokenizer import PAD_ID


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
