"""Tokenize a corpus once into a token store (`train.data.store.token_store`): bounded
memory, parallel, resumable, deterministic.

    inputs -> plan (shards) -> tokenizer sample -> SentencePiece -> shards -> manifest

- Inputs (`train.data.store.store_inputs`): `--config.corpus=text` with
  `--config.corpus_path` a file or a glob (`**` allowed) of plain-text files (a document per
  non-blank line, blank-line separated paragraph or file: `--config.corpora.text.documents`) or JSON
  lines (`.jsonl`/`.json`: one document per record, its `--config.corpora.text.field`), each
  possibly gzip (`.gz`) or zstd (`.zst`) compressed; or `--config.corpus=kjv`, the shipped
  King James Bible. Documents are kept verbatim unless `--config.collapse_whitespace=True`.
- Plan: a shard is an uncompressed file's byte range of about `store_shard_bytes` (a line
  belongs to the range its first byte is in) or a whole file (compressed, or documents
  that span lines). The plan is a function of the files alone, so every process and every
  rerun agrees on it.
- Split: each document goes to train, validation or test by a hash of its text, the rule of
  `train.formats.corpora.splits.split_examples`, or, from the user's own `--config.valid_path` /
  `test_path` files, to that split (the hash then holds out no document for it); test
  documents are counted and not stored.
- Tokenizer: SentencePiece (lossless where the documents are verbatim: byte fallback,
  whitespace kept) is trained on the train documents with the smallest split hashes,
  up to `store_sample_chars` characters: a sample of the corpus that is the same whatever the
  file order, the number of processes or the work directory, taken with bounded memory (each
  shard keeps its own smallest, then they are merged), and small enough that SentencePiece
  uses all of it without its unseeded shuffle.
- Shards: worker processes (`--config.prepare_workers`) tokenize shards; each is written into
  a temporary directory and renamed when whole, so a shard is complete or absent, and a rerun
  (after a crash, a kill or a full disk) redoes only the missing ones. `part=(i, n)` takes
  shards i, i + n, ... (several machines, one shared directory); whichever part finishes
  last writes the manifest.
The same inputs and settings give the same bytes (tested).
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import logging
import multiprocessing
import os
import pathlib
import shutil
import tempfile
import time
from collections.abc import Sequence

import numpy as np

from train.core.failures import RunFailure
from train.data.dataset import Processes
from train.data.spm_tokenizer import SentencePieceTokenizer
from train.data.store.store_inputs import Source, documents, plan_shards, split_of
from train.data.store.token_store import (
    MANIFEST,
    SHARD_META,
    SHARDS,
    TOKENIZER_FILE,
    StoreError,
    TokenStore,
    begin_store,
    file_sha256,
    finish_store,
    shard_name,
    split_files,
    store_settings,
    token_dtype,
    tokenizer_path,
    umask,
    write_json_file,
)
from train.data.tokenizer import SpecialIds
from train.data.tokenizers import Vocabulary, open_tokenizer
from train.formats.sources import CONFIG_FILE, snapshot
from train.formats.sources import Source as PretrainedSource

# Documents tokenized per call of the tokenizer (bounded memory per worker).
_DOCS_PER_CALL = 2048


class StoreWriteError(RunFailure):
    """A shard or file of the store could not be written (disk full, I/O): rerun to finish."""


def _sample_shard(args) -> list[tuple[float, str]]:
    """The train documents of one shard with the smallest split hashes, up to `budget`
    characters: (hash, text), smallest first."""
    source, text_field, valid, test, mode, collapse, budget = args
    heap: list[tuple[float, str]] = []  # max-heap by hash (negated)
    total = 0
    if source.role:  # the user's validation or test file
        return []
    for text in documents(source, text_field, mode, collapse):
        split, u = split_of(text, valid, test)
        if split != "train":
            continue
        heapq.heappush(heap, (-u, text))
        total += len(text)
        while total > budget and heap:
            _, dropped = heapq.heappop(heap)
            total -= len(dropped)
    return sorted((-u, text) for u, text in heap)


def tokenizer_sample(sources: Sequence[Source], data, workers: int) -> list[str]:
    """The train documents SentencePiece learns from (see the module docstring): those with
    the smallest split hashes, in hash order, while their characters fit `store_sample_chars`.

    Each shard's candidates are merged into the running selection as they arrive, so memory
    holds one budget of text plus one shard's candidates. Every document of the final sample
    survives each cut on the way (fewer documents precede it at any partial cut), so the
    result does not depend on the order in which the shards finish.
    """
    budget = data.store_sample_chars
    valid, test = data.hash_fractions
    reading = (data.corpora.text.documents, data.collapses_whitespace)
    args = [(s, data.corpora.text.field, valid, test, *reading, budget) for s in sources]
    selected: list[tuple[float, str]] = []
    for part in _map(_sample_shard, args, workers):
        selected = _within(heapq.merge(selected, part), budget)
    return [text for _, text in selected]


def _within(candidates, budget: int) -> list[tuple[float, str]]:
    """The leading candidates (by hash) whose characters add up to at most `budget`."""
    kept, total = [], 0
    for u, text in candidates:
        if total + len(text) > budget:
            break
        kept.append((u, text))
        total += len(text)
    return kept


def _map(fn, args: list, workers: int, *, here=None):
    """fn over args in worker processes (spawned: the caller may have started jax), results in
    the order they finish; `here`: fn as this process runs it, where it runs them itself (it
    may use what this process holds open, which a spawned worker reads again)."""
    if workers <= 1 or len(args) <= 1:
        yield from map(here or fn, args)
        return
    context = multiprocessing.get_context("spawn")
    with context.Pool(min(workers, len(args))) as pool:
        yield from pool.imap_unordered(fn, args)


class _SplitWriter:
    """Appends documents (BOS ids EOS, or ids EOS where the tokenizer starts a sequence with no
    BOS: `SpecialIds.document`) to a split's token and offset files."""

    def __init__(self, folder: pathlib.Path, split: str, dtype: np.dtype, specials: SpecialIds):
        tokens_name, docs_name = split_files(split)
        self.names = (tokens_name, docs_name)
        self.files = [open(folder / tokens_name, "wb"), open(folder / docs_name, "wb")]  # noqa: SIM115
        self.dtype = dtype
        self.specials = specials
        self.tokens = self.docs = self.chars = 0

    def add(self, docs_ids: list[list[int]], texts: list[str]) -> None:
        start = int(self.specials.starts_with_bos)  # the BOS, where a sequence starts with one
        lengths = np.fromiter((len(ids) + start + 1 for ids in docs_ids), np.int64, len(docs_ids))
        starts = self.tokens + np.cumsum(lengths) - lengths
        flat = np.empty((int(lengths.sum()),), self.dtype)
        position = 0
        for ids, length in zip(docs_ids, lengths, strict=True):
            if start:
                flat[position] = self.specials.bos
            flat[position + start : position + length - 1] = ids
            flat[position + length - 1] = self.specials.eos
            position += length
        self.files[0].write(flat.tobytes())
        self.files[1].write(starts.astype("<i8").tobytes())
        self.tokens += int(lengths.sum())
        self.docs += len(docs_ids)
        self.chars += sum(len(t) + 1 for t in texts)

    def close(self) -> dict:
        for f in self.files:
            f.flush()
            os.fsync(f.fileno())
            f.close()
        return {"tokens": self.tokens, "docs": self.docs, "chars": self.chars}


def _write_shard(args, pretrained: PretrainedSource | None = None) -> dict:
    """Tokenizes one shard into `shards/<name>` (via a temporary directory): its shard.json.
    `pretrained`: the run's source, open, where this process writes the shard (a worker
    process reads the store's copy of its tokenizer)."""
    index, source, store_dir, data_fields = args
    store_dir = pathlib.Path(store_dir)
    kind, vocab, text_field, valid, test, mode, collapse = data_fields
    tokenizer = open_tokenizer(kind, vocab, tokenizer_path(store_dir, kind), source=pretrained)
    dtype = token_dtype(vocab)
    final = store_dir / SHARDS / shard_name(index)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    os.chmod(tmp, 0o777 & ~umask())  # mkdtemp's 0700 would hide a shared store from others
    try:
        writers = {
            split: _SplitWriter(tmp, split, dtype, tokenizer.specials)
            for split in ("train", "valid")
        }
        batch: dict[str, list[str]] = {"train": [], "valid": []}
        skipped_test = 0

        def flush(split: str) -> None:
            texts = batch[split]
            if texts:
                writers[split].add(_encode_all(tokenizer, texts, vocab), texts)
                batch[split] = []

        for text in documents(source, text_field, mode, collapse):
            split, _ = split_of(text, valid, test, source.role)
            if split == "test":
                skipped_test += 1
                continue
            batch[split].append(text)
            if len(batch[split]) >= _DOCS_PER_CALL:
                flush(split)
        meta = {"name": final.name, "source": dataclasses.asdict(source), "splits": {}}
        meta["files"] = {}
        for split, writer in writers.items():
            flush(split)
            meta["splits"][split] = writer.close()
            for name in writer.names:
                meta["files"][name] = {
                    "bytes": (tmp / name).stat().st_size,
                    "sha256": file_sha256(tmp / name),
                }
        meta["test_docs"] = skipped_test
        write_json_file(tmp / SHARD_META, meta)
        os.replace(tmp, final)
        return meta
    except OSError as err:
        shutil.rmtree(tmp, ignore_errors=True)
        raise StoreWriteError(
            f"could not write shard {final.name} of the token store {store_dir} ({err}) ; "
            "free disk space or fix the cause, then rerun the same command: finished shards "
            "are kept."
        ) from err
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _encode_all(tokenizer, texts: list[str], vocab: int) -> list[list[int]]:
    if isinstance(tokenizer, SentencePieceTokenizer):
        docs = tokenizer.encode_batch(texts)
    else:
        docs = [tokenizer.encode(t) for t in texts]
    top = max((max(ids) for ids in docs if ids), default=0)
    if top >= vocab:
        raise StoreError(f"token id {top} outside the vocabulary of {vocab} ; delete the store.")
    return docs


def prepare_plan_and_tokenizer(
    data, vocabulary: Vocabulary, *, workers: int | None = None
) -> list[Source]:
    """The first stage of `prepare_store`: the store's plan and its tokenizer (trained on the
    sample where missing, or copied from the pretrained model). Idempotent; one process of a
    run does it before the others start.

    Returns:
        The shards' sources.

    Raises:
        as `prepare_store`.
    """
    settings = store_settings(data, vocabulary)
    return _plan_and_tokenizer(data, vocabulary, settings, _workers(data, workers))


def _plan_and_tokenizer(data, vocabulary: Vocabulary, settings: dict, workers: int):
    store_dir = pathlib.Path(data.store_dir)
    shards = plan_shards(data)
    try:
        begin_store(store_dir, settings, [dataclasses.asdict(s) for s in shards])
        _ensure_tokenizer(store_dir, shards, data, vocabulary, workers)
    except OSError as err:
        raise StoreWriteError(
            f"could not write the token store {store_dir} ({err}) ; fix the cause and rerun."
        ) from err
    return shards


def _workers(data, workers: int | None) -> int:
    if workers is None:
        workers = data.prepare_workers or os.cpu_count() or 1
    return workers


def prepare_store(
    data,
    vocabulary: Vocabulary,
    *,
    workers: int | None = None,
    part: tuple[int, int] = (0, 1),
    progress: bool = True,
) -> TokenStore | None:
    """Prepares (or finishes) the token store `data.store_dir` from the data section's corpus.

    Args:
        data: the data section (`train.config.sections.DataConfig`); its store fields and corpus.
        vocabulary: the run's ids (`train.data.tokenizers.vocabulary`).
        workers: worker processes (default `data.prepare_workers`, 0 = every core).
        part: (i, n): prepare shards i, i + n, ... only (machine i of n, one shared store).
        progress: show a progress bar with tokens/s.

    Returns:
        The open store once every shard is there; None when other parts still miss shards.

    Raises:
        FileNotFoundError, StoreError: bad inputs or a store begun from other inputs.
        StoreWriteError: a write failed (disk full): rerun to finish.
    """
    index, count = part
    if not 0 <= index < count:
        raise ValueError(f"--part={index}/{count}: i must be in [0, n).")
    settings = store_settings(data, vocabulary)
    if (pathlib.Path(data.store_dir) / MANIFEST).is_file():
        return TokenStore.open(data.store_dir, settings)
    return _prepare(data, vocabulary, settings, _workers(data, workers), part, progress)


def _prepare(data, vocabulary, settings: dict, workers: int, part, progress: bool):
    """`prepare_store` of a store not yet whole, its settings computed."""
    store_dir = pathlib.Path(data.store_dir)
    index, count = part
    sources = _plan_and_tokenizer(data, vocabulary, settings, workers)
    mine = [i for i in range(len(sources)) if i % count == index]
    _remove_stale(store_dir, mine)
    todo = [i for i in mine if not (store_dir / SHARDS / shard_name(i) / SHARD_META).is_file()]
    fields = (
        data.tokenizer,
        settings["vocab_size"],
        data.corpora.text.field,
        *data.hash_fractions,
        data.corpora.text.documents,
        data.collapses_whitespace,
    )
    logging.info(
        "Token store %s: %d shards (%d in this part, %d to do) with %d worker(s).",
        store_dir,
        len(sources),
        len(mine),
        len(todo),
        workers,
    )
    _tokenize_shards(store_dir, sources, todo, fields, workers, progress, vocabulary.opened)
    missing = [i for i in range(len(sources)) if not (store_dir / SHARDS / shard_name(i)).is_dir()]
    if missing:
        logging.info("Token store %s: %d shards left to other parts.", store_dir, len(missing))
        return None
    try:
        return finish_store(store_dir, len(sources), settings)
    except OSError as err:
        raise StoreWriteError(
            f"could not write {store_dir / MANIFEST} ({err}) ; fix the cause and rerun."
        ) from err


def prepare_for_run(data, vocabulary: Vocabulary, processes: Processes) -> TokenStore:
    """A run's store, opened, and prepared first where it is missing: process 0 plans it and
    makes its tokenizer (trained on the sample, or copied from the pretrained model), then
    every process tokenizes its part of the shards (`processes.part`).

    Raises:
        as `prepare_store`.
    """
    store_dir = pathlib.Path(data.store_dir)
    settings = store_settings(data, vocabulary)
    if (store_dir / MANIFEST).is_file():
        return TokenStore.open(store_dir, settings)
    logging.info("No token store in %s: preparing it (train.prepare).", store_dir)
    workers = _workers(data, None)
    if processes.primary:
        _plan_and_tokenizer(data, vocabulary, settings, workers)
    processes.barrier("store-tokenizer")
    store = _prepare(data, vocabulary, settings, workers, processes.part, processes.primary)
    processes.barrier("store-shards")
    return store if store is not None else TokenStore.open(store_dir, settings)


def _ensure_tokenizer(
    store_dir: pathlib.Path, shards, data, vocabulary: Vocabulary, workers: int
) -> None:
    if data.tokenizer == "pretrained":  # a copy of the model's tokenizer, for the workers
        copy = tokenizer_path(store_dir, "pretrained")
        if not (copy / CONFIG_FILE).is_file():
            snapshot(vocabulary.opened, copy)
        return
    model = store_dir / TOKENIZER_FILE
    if data.tokenizer != "sentencepiece" or model.is_file():
        return
    started = time.perf_counter()
    sample = tokenizer_sample(shards, data, workers)
    if not sample:
        raise StoreError(
            f"the corpus {data.corpus_path or data.corpus!r} has no training document ; check "
            "--config.corpus_path and --config.valid_fraction."
        )
    logging.info(
        "Training SentencePiece (vocab %d) on a sample of %d documents (%d characters)...",
        data.vocab_size,
        len(sample),
        sum(map(len, sample)),
    )
    SentencePieceTokenizer.train_or_load(
        sample,
        model,
        data.vocab_size,
        input_sentence_size=0,  # 0: all of the sample
        lossless=not data.collapses_whitespace,
    )
    logging.info("Tokenizer trained in %.1f s.", time.perf_counter() - started)


def _remove_stale(store_dir: pathlib.Path, mine: Sequence[int]) -> None:
    """Removes the temporary directories an interrupted preparation left for these shards."""
    for index in mine:
        for stale in (store_dir / SHARDS).glob(f".{shard_name(index)}.tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)


def _tokenize_shards(store_dir, inputs, todo, fields, workers, progress, pretrained) -> None:
    from tqdm import tqdm

    args = [(i, inputs[i], str(store_dir), fields) for i in todo]
    started, tokens = time.perf_counter(), 0
    here = functools.partial(_write_shard, pretrained=pretrained)
    with tqdm(total=len(todo), unit="shard", disable=not progress or not todo) as bar:
        for meta in _map(_write_shard, args, workers, here=here):
            tokens += sum(split["tokens"] for split in meta["splits"].values())
            bar.update(1)
            bar.set_postfix(tok_s=f"{tokens / (time.perf_counter() - started):.3g}")
    if todo:
        elapsed = time.perf_counter() - started
        logging.info(
            "Tokenized %d shard(s): %d tokens in %.1f s (%.3g tokens/s).",
            len(todo),
            tokens,
            elapsed,
            tokens / elapsed,
        )
