"""Tokenize a corpus once into a token store: `python -m train.prepare --config ...`.

    python -m train.prepare --config configs/llama_1b.py \\
        --config.corpus=text --config.corpus_path='data/*.jsonl.zst' \\
        --config.store_dir=/shared/stores/my_corpus --config.vocab_size=32000

It takes the same `--config` and `--config.<field>=` flags as train.main (only the data
fields matter) and writes the store `--config.store_dir` names (`train.data.store.store_prepare`):
worker processes over the cores (`--config.prepare_workers`), a progress bar with tokens/s,
finished shards kept when rerun. On several machines sharing the directory, run it on each
with `--part=i/n` (i = 0 ... n - 1): each tokenizes its shards, and the last to finish writes
the manifest (start part 0 first, or let every part train the same tokenizer). train.main
prepares a missing store itself, so this command is only needed to do it ahead of time.
A chat run's flags (`--config.task=chat`) write its conversations, rendered and masked, in
one process (`train.data.chat.store`; `--part` and `--workers` do not apply).

Exit status (as train.main): 0 when the store is whole (or this part is done), 2 for a usage
error (a bad flag or config value, inputs that match nothing or are not UTF-8, a store of
other settings), 1 for a failed write (disk full: rerun to finish). Errors are one line.
"""

from __future__ import annotations

import sys

from absl import app, flags, logging

from train.core.cli import (
    define_config_flag,
    die,
    loaded_config,
    parse_config_flags,
    quiet_library_logs,
)
from train.core.failures import RUN_ERROR, USAGE_ERROR

FLAGS = flags.FLAGS
flags.DEFINE_string("part", "0/1", "i/n: prepare shards i, i+n, ... (machine i of n).")
flags.DEFINE_integer(
    "workers", None, "Worker processes (default --config.prepare_workers; 0 = every core)."
)


def _part(text: str) -> tuple[int, int]:
    try:
        index, count = (int(x) for x in text.split("/"))
    except ValueError:
        raise ValueError(f"--part={text!r} must be i/n, e.g. 0/4.") from None
    if not 0 <= index < count:
        raise ValueError(f"--part={text}: i must be in [0, n).")
    return index, count


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        die(f"unexpected arguments {argv[1:]} ; use --flag=value.", USAGE_ERROR)
    config = loaded_config(FLAGS.config)
    quiet_library_logs()
    from train.config import config_lib
    from train.data.chat.store import prepare_chat_store
    from train.data.store.store_prepare import StoreWriteError, prepare_store
    from train.data.tokenizers import vocabulary
    from train.tasks import get_task

    try:
        part = _part(FLAGS.part)
        experiment = config_lib.validate_config(config)
        data = experiment.data
        if not data.store_dir:
            raise ValueError(
                "--config.store_dir='' : name the directory to write the token store to."
            )
        ids = vocabulary(data, experiment.model.vocab_size)
        if get_task(data.task).stores_masks:  # conversations: one shard, one process
            store, _ = prepare_chat_store(data, ids)
        else:
            store = prepare_store(data, ids, workers=FLAGS.workers, part=part)
    except StoreWriteError as err:
        die(str(err), RUN_ERROR)
    except (ValueError, FileNotFoundError) as err:
        die(str(err), USAGE_ERROR)
    if store is None:
        print(f"part {FLAGS.part} done; other parts still miss shards of {data.store_dir}.")
        return
    totals = store.manifest["totals"]
    logging.info("Token store %s is whole.", store.path)
    print(
        f"token store {store.path}: {totals['train']['tokens']:,} train tokens in "
        f"{totals['train']['docs']:,} documents, {totals['valid']['tokens']:,} validation "
        f"tokens, {len(store.manifest['shards'])} shard(s)."
    )


def run() -> None:
    define_config_flag(sys.argv)
    app.run(main, flags_parser=parse_config_flags)


if __name__ == "__main__":
    run()
