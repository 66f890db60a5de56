"""A run's data from a token store (`train.data.store.token_store`), read through grain:
`open_store_dataset` prepares the store where it is missing and gives the training loop its
`train.data.dataset.Dataset`.

A split's token stream is cut into windows of max_len + 1 tokens that overlap by one (window
w covers tokens [w T, w T + T + 1): T inputs and their T next tokens). Training reads:

    order    grain.MapDataset.range(W).shuffle(seed).repeat()   every epoch its own permutation
    batch k  the windows order[k B], ..., order[k B + B - 1]     B = batch_size
    process  its rows of batch k (`RowShare`: the rows its devices hold), read by memory map

so the global batch at step k is a function of (store, seed, k) alone: the same for any
number of processes or devices, and the whole data state of a run is its step (a resumed run,
on another slice too, starts reading at its step; nothing is replayed). Batches are read and
prefetched by `loader_threads` threads in the training process (grain's `ReadOptions`), not in
worker processes, whose state would depend on their count.

`packing='stream'` gives the windows as they are (attention crossing documents, as in GPT
training); `packing='segments'` gives the same windows with segment ids, one per document
piece (1, 2, ... within a window), so attention and positions stay within each document, and
the label of each document's EOS (the next document's first token) masked.

Validation reads the validation split's windows in order, unshuffled, and its last partial
window padded: every validation token is scored, so bits per character are exact.
"""

from __future__ import annotations

import math
import pathlib
import shutil
from collections.abc import Iterator, Mapping

import grain
import numpy as np

from train.core.rundir import RunDir
from train.data.batching import WHOLE_BATCH, Batch, RowShare
from train.data.dataset import ONE_PROCESS, Dataset, ExampleTask, Processes
from train.data.packing import get_packer
from train.data.store import store_prepare
from train.data.store.token_store import (
    TOKENIZER_FILE,
    StoreError,
    TokenStore,
    tokenizer_path,
)
from train.data.tokenizer import PAD_ID
from train.data.tokenizers import Vocabulary, open_tokenizer

# Batches read ahead per process: enough that the step never waits, few enough to stay small.
PREFETCH_BATCHES = 8
# grain seeds are 32-bit.
_SEED_MASK = (1 << 32) - 1


class WindowSource:
    """The windows of one split of a store, as a grain random-access source.

    Args:
        store: the open store.
        split: 'train' or 'valid'.
        seq_len: T, the tokens of a window's inputs (the model's max_len).
        segments: add segment ids per document and mask cross-document labels.
        pad_id: the tokenizer's pad id (what a masked label becomes).
        tail: add the last, partial window, padded (validation: every token is scored).
    """

    def __init__(
        self,
        store: TokenStore,
        split: str,
        seq_len: int,
        *,
        segments: bool,
        pad_id: int = PAD_ID,
        tail: bool = False,
    ):
        self.store, self.split, self.seq_len, self.segments = store, split, seq_len, segments
        self.pad_id, self.tail = pad_id, tail

    def __len__(self) -> int:
        labels = max(self.store.num_tokens(self.split) - 1, 0)
        return -(-labels // self.seq_len) if self.tail else labels // self.seq_len

    def __getitem__(self, index: int) -> Batch:
        start = int(index) * self.seq_len
        stop = min(start + self.seq_len + 1, self.store.num_tokens(self.split))
        chunk = self.store.read(self.split, start, stop)
        width = self.seq_len + 1 - len(chunk)  # > 0 for the tail window only
        padded = np.pad(chunk, (0, width), constant_values=self.pad_id)
        example = {"inputs": padded[:-1], "targets": padded[1:].copy()}
        if self.segments:
            docs = self.store.documents_of(self.split, start, stop)
            example["targets"][: len(docs) - 1][docs[1:] != docs[:-1]] = self.pad_id
            segment_ids = (docs[:-1] - docs[0] + 1).astype(np.int32)
            example["segment_ids"] = np.pad(segment_ids, (0, width))  # 0: padding
        return example


def _rows_of(share: RowShare, batch_size: int) -> range:
    part = share.rows(batch_size)
    return range(part.start, part.stop)


def train_batches(
    source: WindowSource,
    *,
    seed: int,
    batch_size: int,
    share: RowShare = WHOLE_BATCH,
    start_step: int = 0,
    num_steps: int,
    threads: int = 4,
) -> Iterator[Batch]:
    """This process's rows of the global batches start_step, ..., num_steps - 1.

    Args:
        source: the train split's windows.
        task: the run's task (`train.tasks.get_task(data.task)`), as a value.
        seed: the run's seed (the shuffle of every epoch derives from it).
        batch_size: B, windows per global batch.
        share: this process's rows of every batch.
        start_step: the first batch (0-based; a resumed run's step).
        num_steps: batches in the whole run.
        threads: reading and prefetching threads.

    Returns:
        An iterator of numpy batches (`inputs`, `targets`, and `segment_ids` with segments),
        each `(B / share.count, T)` int32.
    """
    order = grain.MapDataset.range(len(source)).shuffle(seed=seed & _SEED_MASK).repeat()
    rows = _rows_of(share, batch_size)

    def row(j: int) -> Batch:
        step, r = divmod(j, len(rows))
        return source[order[step * batch_size + rows.start + r]]

    dataset = grain.MapDataset.range(start_step * len(rows), num_steps * len(rows))
    dataset = dataset.map(row).batch(len(rows))
    options = grain.ReadOptions(num_threads=threads, prefetch_buffer_size=PREFETCH_BATCHES)
    return iter(dataset.to_iter_dataset(options))


def eval_batches(
    source: WindowSource, *, batch_size: int, share: RowShare, max_batches: int = 0
) -> list[Batch]:
    """This process's rows of the validation batches: windows in order, the last batch padded
    with empty rows (whose labels are all padding).

    Args:
        source: the validation split's windows.
        batch_size: B, windows per batch.
        share: this process's rows.
        max_batches: at most this many batches (0: all).
    """
    count = math.ceil(len(source) / batch_size)
    if max_batches:
        count = min(count, max_batches)
    rows = _rows_of(share, batch_size)
    # Padding everywhere; segment id 0 marks padding too.
    empty = {
        key: np.full_like(value, 0 if key == "segment_ids" else source.pad_id)
        for key, value in source[0].items()
    }
    batches = []
    for b in range(count):
        items = [
            source[b * batch_size + r] if b * batch_size + r < len(source) else empty for r in rows
        ]
        batches.append({key: np.stack([item[key] for item in items]) for key in empty})
    return batches


class StoreStream:
    """The training batches of a run that reads a store; its state is the next step.

    `state_dict()` is `{'step': k}` (saved in checkpoints); a run resumed at step k reads from
    batch k whatever its number of processes.
    """

    def __init__(self, make_iterator, start_step: int):
        self._iterator = make_iterator(start_step)
        self._step = start_step

    def state_dict(self) -> dict[str, int]:
        return {"step": self._step}

    def __iter__(self):
        return self

    def __next__(self) -> Batch:
        batch = next(self._iterator)
        self._step += 1
        return batch


def open_store_dataset(
    data,
    vocabulary: Vocabulary,
    run: RunDir,
    *,
    task: ExampleTask,
    seed: int,
    num_steps: int,
    num_devices: int = 1,
    share: RowShare = WHOLE_BATCH,
    max_eval_batches: int = 0,
    processes: Processes = ONE_PROCESS,
) -> Dataset:
    """The Dataset of a run that reads the token store `data.store_dir`, prepared first where
    it is missing (process 0 plans it and trains or copies the tokenizer, then every
    process tokenizes its part of the shards).

    Args:
        data: the data section (its store fields set).
        vocabulary: the run's ids (`train.data.tokenizers.vocabulary`): what the store must
            hold.
        run: the run directory (process 0 copies the store's SentencePiece model there, for
            the tools).
        seed: the run's seed (the window order).
        num_steps: the run's train steps (batches).
        num_devices: data-parallel devices; the batch size must be a multiple of it.
        share: this process's rows of each batch.
        max_eval_batches: validation batches kept (0: all).
        processes: this process's part (`train.data.dataset.Processes`).

    Raises:
        FileNotFoundError, ValueError (StoreError): bad inputs, a store of other settings,
            a damaged shard, or a split too short for one window.
    """
    get_packer("stream").check(data, num_devices, share)  # windows: batch_size rows
    store = store_prepare.prepare_for_run(data, vocabulary, processes)
    kind = data.tokenizer
    # A pretrained tokenizer is the run's open source's (the store's copy is of the same
    # tokenizer: its settings hold the tokenizer's SHA-256).
    path = tokenizer_path(store.path, kind)
    tokenizer = open_tokenizer(kind, data.vocab_size, path, source=vocabulary.opened)
    segments, pad_id = data.packing == "segments", tokenizer.pad_id
    train = WindowSource(store, "train", data.max_len, segments=segments, pad_id=pad_id)
    valid = WindowSource(store, "valid", data.max_len, segments=segments, pad_id=pad_id, tail=True)
    for name, source in (("train", train), ("validation", valid)):
        if len(source) == 0:
            raise StoreError(
                f"the {name} split of the token store {store.path} has "
                f"{store.num_tokens(source.split)} tokens, fewer than one window of "
                f"max_len + 1 = {data.max_len + 1} ; use a larger corpus, a smaller "
                "--config.max_len, or (validation) a larger --config.valid_fraction."
            )
    if processes.primary and kind == "sentencepiece":
        _copy_tokenizer(store, run.tokenizer_model(data.vocab_size))

    def make_stream(_seed, saved: Mapping | None, start_step: int) -> StoreStream:
        # The store's window order comes from the run's seed, given above.
        if saved is not None and saved.get("step", start_step) != start_step:
            raise StoreError(
                f"the checkpoint's data state {dict(saved)} does not match its step "
                f"{start_step} ; delete the checkpoint or use a fresh --workdir."
            )
        return StoreStream(
            lambda k: train_batches(
                train,
                seed=seed,
                batch_size=data.batch_size,
                share=share,
                start_step=k,
                num_steps=num_steps,
                threads=data.loader_threads,
            ),
            start_step,
        )

    return Dataset(
        task=task,
        tokenizer=tokenizer,
        eval_batches=eval_batches(
            valid, batch_size=data.batch_size, share=share, max_batches=max_eval_batches
        ),
        valid_examples=[],
        chars_per_token=_chars_per_label(store, segments),
        sizes={
            "train": store.num_documents("train"),
            "valid": store.num_documents("valid"),
            "test": sum(s["test_docs"] for s in store.manifest["shards"]),
            "train_tokens": store.num_tokens("train"),
            "train_windows": len(train),
        },
        fingerprint=store.fingerprint,
        make_stream=make_stream,
    )


def _chars_per_label(store: TokenStore, segments: bool) -> float:
    """Characters of the validation documents per validation label. Validation scores every
    token after the first (the tail window included), less, with segments, the label of each
    document boundary (EOS -> the next document's first token); the store counts one line
    break per document beside its text, which is no character of it."""
    docs = store.num_documents("valid")
    labels = store.num_tokens("valid") - 1 - (docs - 1 if segments else 0)
    return (store.num_chars("valid") - docs) / max(labels, 1)


def _copy_tokenizer(store: TokenStore, target: pathlib.Path) -> None:
    """Copies the store's SentencePiece model into the run directory (for train.sample), unless
    an identical one is there."""
    model = store.path / TOKENIZER_FILE
    if not model.is_file():
        return
    if target.is_file() and target.read_bytes() == model.read_bytes():
        return
    tmp = target.with_name(f".{target.name}.tmp")
    shutil.copyfile(model, tmp)
    tmp.replace(target)
