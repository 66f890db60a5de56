"""The run's data: `open_dataset` chooses how the data section is read, and gives the
training loop one `train.data.dataset.Dataset` either way.

- a token store (`train.data.store.store_pipeline.open_store_dataset`): the section names one
  (`--config.store_dir`), or it is a text language model, which then prepares one under its
  work directory (`run_data_section`), so its memory stays flat in corpus size; a task whose
  examples carry a loss mask (chat) reads its own kind of store
  (`train.data.chat.rows.open_chat_store_dataset`), only where the section names one;
- the corpus in memory (`train.data.pipeline.in_memory.build_dataset`): translation, and the corpora
  a store cannot hold.
"""

from __future__ import annotations

import dataclasses
import logging

from train.config.sections import DataConfig
from train.core.rundir import RunDir, read_json
from train.data.batching import WHOLE_BATCH, RowShare
from train.data.chat.rows import open_chat_store_dataset
from train.data.dataset import ONE_PROCESS, Dataset, ExampleTask, Processes
from train.data.pipeline.in_memory import build_dataset
from train.data.store.store_pipeline import open_store_dataset
from train.data.tokenizers import Vocabulary
from train.formats import corpora

# The packings a token store is read with (windows of batch_size rows).
_STORE_PACKINGS = ("stream", "segments")


def open_dataset(
    data: DataConfig,
    run: RunDir,
    vocabulary: Vocabulary,
    *,
    task: ExampleTask,
    seed: int,
    num_steps: int,
    num_devices: int = 1,
    share: RowShare = WHOLE_BATCH,
    max_eval_batches: int = 0,
    processes: Processes = ONE_PROCESS,
    resuming: bool = False,
) -> Dataset:
    """The run's data, whichever path reads it: the one entry point of the training loop.

    A token store is read where the data section names one, and where a text language
    model names none (`run_data_section`: a store under the work directory); otherwise the
    corpus is read in memory.

    Args:
        data: the data section.
        run: the run directory.
        vocabulary: the run's ids, resolved from its config (`train.data.tokenizers.vocabulary`):
            what a token store is prepared for; it carries the run's pretrained source, open
            (`Vocabulary.opened`), which every path takes its tokenizer and chat template from.
        task: the run's task (`train.tasks.get_task(data.task)`), as a value.
        seed, num_steps: the run's seed and train steps.
        num_devices, share: data-parallel devices and this process's rows of every batch.
        max_eval_batches: validation batches kept from a store (0: all).
        processes: this process's part (`Processes`).
        resuming: the run resumes (a run that began in memory goes on in memory).
    """
    data = run_data_section(data, run, resuming)
    if data.store_dir and task.stores_masks:
        return open_chat_store_dataset(
            data,
            vocabulary,
            task=task,
            seed=seed,
            num_steps=num_steps,
            num_devices=num_devices,
            share=share,
            max_eval_batches=max_eval_batches,
            processes=processes,
        )
    if data.store_dir:
        return open_store_dataset(
            data,
            vocabulary,
            run,
            task=task,
            seed=seed,
            num_steps=num_steps,
            num_devices=num_devices,
            share=share,
            max_eval_batches=max_eval_batches,
            processes=processes,
        )
    return build_dataset(
        data,
        run,
        task=task,
        seed=seed,
        num_devices=num_devices,
        share=share,
        processes=processes,
        source=vocabulary.opened,
    )


def run_data_section(data: DataConfig, run: RunDir, resuming: bool) -> DataConfig:
    """The data section a run reads: a language model of files (a corpus whose entry has
    `store_files`, `--config.corpus=text`) given no `store_dir` reads a
    token store under its work directory (`RunDir.token_store`, prepared on first use), so
    its memory stays flat in corpus size.

    Packed segments sized by `tokens_per_batch` (configs/default.py's) become the store's
    windows of the same size: `tokens_per_batch // max_len` rows of max_len tokens.

    It reads the corpus in memory as before where `corpora.text.in_memory` asks, where its batches
    need whole examples (packing 'none'), or where it resumes a run that started so (its
    data_fingerprint.json holds example counts, not a store's token counts): such a run goes
    on with the batches it began with.
    """
    reads_at_scale = corpora.get_corpus(data.corpus).store_files  # files of any size
    if data.store_dir or data.task != "lm" or not reads_at_scale or data.corpora.text.in_memory:
        return data
    if resuming and run.data_fingerprint.exists():
        recorded = read_json(run.data_fingerprint, "delete it and rerun: it is rewritten")
        if "store_train_tokens" not in recorded:
            logging.info("Resuming a run that read its text corpus in memory: it still does.")
            return data
    rows = data.batch_size or data.tokens_per_batch // data.max_len
    if data.packing not in _STORE_PACKINGS or not rows:
        logging.warning(
            "--config.packing=%r reads the text corpus in memory (memory grows with the "
            "corpus); packing 'stream' or 'segments' reads it from a token store under the "
            "work directory.",
            data.packing,
        )
        return data
    if not data.batch_size:
        logging.info(
            "Token store windows: %d rows of --config.max_len=%d tokens "
            "(--config.tokens_per_batch=%d).", rows, data.max_len, data.tokens_per_batch,
        )  # fmt: skip
    return dataclasses.replace(
        data, store_dir=str(run.token_store), batch_size=rows, tokens_per_batch=0
    )
