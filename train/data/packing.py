"""The packers, one per `config.packing` value: how a task's examples become batches.

- 'none' (`Bucketing`): one example per row, rows bucketed by length (`train.data.batching`).
- 'segments' (`Segments`): several whole examples per row, told apart by segment ids
  (`train.data.segment_rows`).
- 'stream' (`Stream`, one-sided tasks: the language model): the examples laid end to end
  in one token stream, cut into windows; attention crosses their boundaries
  (`train.data.stream_windows`).
`get_packer(config.packing)` finds the run's packer; each builds batches for any task from
the task's sides (`Task.sides`) and its examples' tokens on each side (`Task.to_sides`).

The batch builders of the two packed layouts are re-exported here, where their importers
name them (`packing.segment_batches`, `packing.packed_plan`, `packing.stream_batches`, ...).
"""

from __future__ import annotations

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
)
from train.data.segment_rows import (
    PACKING_WINDOW,
    pack_rows,
    packed_batch,
    packed_plan,
    segment_batches,
)
from train.data.stream_windows import stream_batches
from train.data.tokenizer import PAD_ID

if TYPE_CHECKING:
    from train.config.sections import DataConfig

__all__ = [
    "PACKERS",
    "PACKING_WINDOW",
    "Bucketing",
    "Packer",
    "Segments",
    "Stream",
    "get_packer",
    "pack_rows",
    "packed_batch",
    "packed_plan",
    "segment_batches",
    "stream_batches",
]


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
