"""The rows of a batch: how many a batch of each row length holds (`rows_per_batch`), and
which of them one process holds (`RowShare`); plain values that the data pipelines, the
distributed setup and the step all use."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence


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


def rows_per_batch(
    lengths: Sequence[int],
    batch_size: int | None,
    tokens_per_batch: int | None,
    batch_size_multiple: int,
) -> list[int]:
    """Rows per batch for batches of each row length: fixed, or as many as fit
    `tokens_per_batch`, rounded down to a multiple of `batch_size_multiple` and never fewer.

    Raises:
        ValueError: not exactly one of batch_size and tokens_per_batch, or a batch_size that
            is not a positive multiple of batch_size_multiple.
    """
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
        return [batch_size] * len(lengths)
    sizes = []
    for length in lengths:
        rows = tokens_per_batch // length // batch_size_multiple * batch_size_multiple
        sizes.append(max(rows, batch_size_multiple))
    return sizes
