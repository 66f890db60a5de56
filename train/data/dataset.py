"""What the training loop gets from the data (`Dataset`), whichever path made it, a
process's part in making it (`Processes`), and what the data needs of a task (`ExampleTask`).

The data pipelines are handed the run's task as a value (`train.tasks.get_task`, called by
the program) and never import the tasks: `ExampleTask` says which of its members they use."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

import numpy as np

from train.data.tokenizer import SpecialIds, Tokenizer


class ExampleTask(Protocol):
    """The members of a task (`train.tasks.Task`) that the data pipelines call: what its
    examples are made of, how they become ids, and the sides they fill in a batch."""

    name: str
    sides: tuple
    file_corpus: str
    stores_masks: bool

    def fields(self, example) -> tuple: ...

    def sentences(self, examples) -> list: ...

    def encode_split(self, data, tokenizer: Tokenizer, source_dir, examples, split: str) -> Any: ...

    def example_length(self, example) -> int: ...

    def to_sides(self, example, specials: SpecialIds = ...) -> tuple: ...

    def targets(self, examples) -> list: ...


@dataclasses.dataclass
class Dataset:
    """Everything the training loop needs from the data, whichever path read it (a token
    store, `train.data.store.store_pipeline.open_store_dataset`, or the corpus in memory,
    `train.data.pipeline.in_memory.build_dataset`;
    `train.data.pipeline.input_pipeline.open_dataset` chooses).

    Attributes:
        task: the run's task.
        tokenizer: encodes and decodes text; its special ids are the batching's.
        eval_batches: all the validation batches, in a fixed order.
        valid_examples: validation texts: (source, target) pairs, lines, or held-out
            conversations (`train.data.chat.examples.HeldOut`) (empty for a token store,
            which keeps token ids only).
        chars_per_token: characters of the validation texts per validation label (EOS
            and BOS labels count no character), to turn nats per label into bits per
            character of the original text (exact over all the validation batches).
        sizes: example counts: train (real pairs kept), copied ((target, target) pairs added),
            valid/test, and how many were dropped as too long (a store: documents, tokens);
            a chat run adds its conversations cut and dropped by reason, and the tokens read
            and trained, per split (`train.data.chat.examples.ChatCounts.sizes`).
        fingerprint: `data_fingerprint` of the train and validation splits, before
            tokenization (or the token store's `fingerprint`): a resumed run checks that it
            still trains on the same data.
        make_stream: (seed, saved stream state, start step) -> the training batches from
            that step on; see `stream`.
    """

    task: ExampleTask
    tokenizer: Tokenizer
    eval_batches: list[dict[str, np.ndarray]]
    valid_examples: list
    chars_per_token: float
    sizes: dict[str, int]
    fingerprint: dict[str, int | str]
    make_stream: Callable[[int, Mapping | None, int], Iterator]

    def stream(self, seed: int, saved: Mapping | None, start_step: int) -> Iterator:
        """The training batches from `start_step` on: an `EpochStream` restored from `saved`
        (in memory), or a store's `StoreStream`; either has `state_dict()` to checkpoint."""
        return self.make_stream(seed, saved, start_step)


@dataclasses.dataclass(frozen=True)
class Processes:
    """This process's part in a run of several (one process: the defaults).

    Attributes:
        primary: process 0, which trains a tokenizer or prepares a store's plan first.
        barrier: waits until every process reaches the barrier of that name.
        part: (process index, process count), to prepare a store's shards together.
    """

    primary: bool = True
    barrier: Callable[[str], None] = lambda name: None
    part: tuple[int, int] = (0, 1)


# The part of the only process of a run.
ONE_PROCESS = Processes()
