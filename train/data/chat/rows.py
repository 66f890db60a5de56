"""A chat run's data from its token store (`train.data.chat.store`), read through grain:
conversations packed whole into rows with segment ids, each keeping its loss mask.

Epoch e of training is what the in-memory run builds for it (`train.data.packing
.segment_batches` with `epoch_rng(seed, e)`): the conversations shuffled, packed whole by
first-fit decreasing into rows of max_len slots (never cut across rows), the rows shuffled
and cut into batches of batch_size rows, the last one padded with empty rows. Only the
conversations' lengths are needed to plan an epoch (`packing.packed_plan`); a batch's
conversations are read by memory map when grain's threads build it (`packing.packed_batch`).
So the global batch at step k is a function of (store, seed, k), the same for any number of
processes, and equal to the in-memory run's batch k: a run's losses do not depend on which
path read its conversations.

In a row, segment ids number the conversations 1, 2, ... (0 at padding): attention stays
within each and positions restart at each (the model's `segment_ids_BT`), and a label is
the pad id wherever the mask trains no token.

Validation holds every validation conversation, one per row and bucketed by length, as
the in-memory run's (`packing.Segments` at evaluation): the same batches.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping

import grain
import numpy as np

from train.data.batching import WHOLE_BATCH, MaskedTokens, RowShare
from train.data.chat.examples import HeldOut
from train.data.chat.store import prepare_chat_store, read_held_out
from train.data.dataset import ONE_PROCESS, Dataset, ExampleTask, Processes
from train.data.epoch_stream import epoch_rng
from train.data.packing import get_packer, packed_batch, packed_plan
from train.data.store.store_pipeline import PREFETCH_BATCHES, StoreStream
from train.data.store.token_store import StoreError, TokenStore, tokenizer_path
from train.data.tokenizers import Vocabulary, open_tokenizer
from train.formats.corpora.conversations import Conversation

# The packing a chat store is read with (whole conversations, segment ids).
PACKING = "segments"


class Conversations:
    """The conversations of one split of a chat store, read on demand: item i is
    conversation i as its sides' tokens (`(MaskedTokens(ids, mask),)`, `Task.to_sides`).

    Attributes:
        lengths: int64 (N,), each conversation's tokens.
    """

    def __init__(self, store: TokenStore, split: str):
        self.store, self.split = store, split
        starts = store.document_starts(split)
        self._bounds = np.append(starts, store.num_tokens(split)).astype(np.int64)
        self.lengths = np.diff(self._bounds)

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, index: int) -> tuple[MaskedTokens]:
        start, stop = int(self._bounds[index]), int(self._bounds[index + 1])
        ids = self.store.read(self.split, start, stop)
        return (MaskedTokens(ids, self.store.read_mask(self.split, start, stop)),)


class EpochPlans:
    """Which epoch, and which of its batches, global batch k is; the plan of each epoch
    (`packing.packed_plan` of the conversations' lengths with `epoch_rng(seed, e)`),
    computed once and kept while it is read (shared by grain's threads).

    Args:
        lengths: the train conversations' tokens.
        max_len: a row's slots.
        batch_size: rows per global batch.
        task: the run's task (`train.tasks.get_task(data.task)`), as a value.
        seed: the run's seed.
        share: this process's rows.
    """

    def __init__(
        self, lengths: np.ndarray, max_len: int, batch_size: int, seed: int, share: RowShare
    ):
        self._sizes_NK = (np.asarray(lengths, np.int64) - 1)[:, None]
        self._max_len, self._batch_size, self._seed, self._share = max_len, batch_size, seed, share
        self._ends: list[int] = []  # the first global batch after each planned epoch
        self._plans: dict[int, list] = {}
        self._lock = threading.Lock()

    def _plan(self, epoch: int) -> list:
        if epoch not in self._plans:
            if len(self._plans) > 2:  # the epochs grain's threads may still read
                self._plans.pop(min(self._plans))
            self._plans[epoch] = packed_plan(
                self._sizes_NK,
                (self._max_len,),
                self._batch_size,
                epoch_rng(self._seed, epoch),
                False,
                self._share,
            )
        return self._plans[epoch]

    def members(self, step: int) -> list[np.ndarray]:
        """This share's rows (conversation indices) of global batch `step`."""
        with self._lock:
            while not self._ends or self._ends[-1] <= step:
                epoch = len(self._ends)
                self._ends.append((self._ends[-1] if self._ends else 0) + len(self._plan(epoch)))
            epoch = int(np.searchsorted(self._ends, step, side="right"))
            first = self._ends[epoch - 1] if epoch else 0
            return self._plan(epoch)[step - first]


def open_chat_store_dataset(
    data,
    vocabulary: Vocabulary,
    *,
    task: ExampleTask,
    seed: int,
    num_steps: int,
    num_devices: int = 1,
    share: RowShare = WHOLE_BATCH,
    max_eval_batches: int = 0,
    processes: Processes = ONE_PROCESS,
) -> Dataset:
    """The Dataset of a chat run that reads the token store `data.store_dir`, prepared
    first where it is missing (`train.data.chat.store.prepare_chat_store`).

    Args:
        data: the data section (task 'chat', packing 'segments', store_dir and batch_size
            set).
        vocabulary: the run's ids.
        seed: the run's seed (each epoch's order and packing).
        num_steps: the run's train steps.
        num_devices: data-parallel devices; the batch size must be a multiple of it.
        share: this process's rows of each batch.
        max_eval_batches: validation batches kept (0: all).
        processes: this process's part.

    Raises:
        StoreError: a store of other settings, a damaged one, or a language model's.
        ValueError: as the in-memory run.
    """
    packer = get_packer(PACKING)
    packer.check(data, num_devices, share)
    store, prepared = prepare_chat_store(data, vocabulary, processes)
    if not store.has_masks:
        raise StoreError(
            f"the token store {store.path} holds documents, not conversations with a loss "
            "mask ; give a chat run another --config.store_dir."
        )
    chat = store.manifest["chat"]
    if not prepared:
        for line in chat["log"]:
            logging.info(line)
    path = tokenizer_path(store.path, data.tokenizer)  # a copy of the open source's
    tokenizer = open_tokenizer(data.tokenizer, vocabulary.size, path, source=vocabulary.opened)
    pad_id = tokenizer.pad_id
    train = Conversations(store, "train")
    valid = Conversations(store, "valid")
    valid_examples = [valid[i] for i in range(len(valid))]
    eval_batches = packer.batches(
        data, task.sides, valid_examples, None, num_devices, share, evaluation=True, pad_id=pad_id
    )
    plans = EpochPlans(train.lengths, data.max_len, data.batch_size, seed, share)
    part = share.rows(data.batch_size)
    rows = part.stop - part.start

    def batch_at(step: int):
        return packed_batch(task.sides, plans.members(step), train, rows, data.max_len, pad_id)

    def batches_from(start_step: int):
        dataset = grain.MapDataset.range(start_step, num_steps).map(batch_at)
        options = grain.ReadOptions(
            num_threads=data.loader_threads, prefetch_buffer_size=PREFETCH_BATCHES
        )
        return iter(dataset.to_iter_dataset(options))

    def make_stream(_seed, saved: Mapping | None, start_step: int) -> StoreStream:
        if saved is not None and saved.get("step", start_step) != start_step:
            raise StoreError(
                f"the checkpoint's data state {dict(saved)} does not match its step "
                f"{start_step} ; delete the checkpoint or use a fresh --workdir."
            )
        return StoreStream(batches_from, start_step)

    held = [_held_out(record) for record in read_held_out(store)]
    return Dataset(
        task=task,
        tokenizer=tokenizer,
        eval_batches=eval_batches[: max_eval_batches or None],
        valid_examples=held,
        chars_per_token=_chars_per_label(task, valid.lengths, held),
        sizes=dict(chat["sizes"]),
        fingerprint=store.fingerprint,
        make_stream=make_stream,
    )


def _held_out(record: Mapping) -> HeldOut:
    conversation = Conversation(tuple(record["messages"]), record["where"], record["split_key"])
    return HeldOut(conversation, tuple(record["prompt_ids"]), tuple(record["stop_ids"]))


def _chars_per_label(task, lengths: np.ndarray, held: list[HeldOut]) -> float:
    """As the in-memory run counts it (`train.data.pipeline.in_memory`): the characters of the
    validation replies per label (every token of a conversation but its first)."""
    labels = int(lengths.sum()) - len(lengths)
    return sum(len(t) for t in task.targets(held)) / max(labels, 1)
