"""Conversations tokenized once into a token store (`train.data.store.token_store`): a chat run's
ids and loss mask on disk, with the counts its in-memory run logs.

A chat run (`--config.task=chat`) with `--config.store_dir` reads its conversations,
renders and masks them exactly as the in-memory run does (`train.formats.corpora.splits
.read_splits`, then `train.data.chat.examples.encode_conversations`: cut to max_len or
dropped, counted) and writes one shard:

    train.bin, valid.bin            each kept conversation's ids, end to end, as the
                                    template wrote them (no BOS or EOS added)
    train_docs.bin, valid_docs.bin  int64 offset of each conversation's first token
    train_mask.bin, valid_mask.bin  uint8 per token: 1 where the token is a label of the loss
    valid_held_out.jsonl            each kept validation conversation with its prompt ids
                                    (`train.data.chat.examples.HeldOut`), for the replies
                                    the end of the run scores

The manifest's `chat` entry keeps the run's data sizes and log lines (conversations kept,
cut, dropped by reason; tokens read and trained), so a run reading the store reports what
the in-memory run reports. The store's settings add to a language model's
(`store_settings`) what decides the ids and the mask: the chat template (its text and
special tokens, hashed), `train_on`, `max_len` (conversations are cut to fit it) and the
Hugging Face split read; a store prepared with another of them is refused.

The conversations are read in memory once, as the in-memory run reads them at every start:
a chat corpus is small beside a pre-training corpus. Reading is `train.data.chat.rows`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pathlib
import shutil
import tempfile

import numpy as np

from flax_transformer.checks.tokens import check_token_range
from train.data.chat.examples import encode_conversations, held_out, run_chat_encoder
from train.data.chat.template import source_chat_template
from train.data.dataset import ONE_PROCESS, Processes
from train.data.store.store_prepare import StoreWriteError
from train.data.store.token_store import (
    MANIFEST,
    SHARD_META,
    SHARDS,
    StoreError,
    TokenStore,
    begin_store,
    file_sha256,
    finish_store,
    mask_file,
    shard_name,
    split_files,
    store_settings,
    token_dtype,
    tokenizer_path,
    umask,
    write_json_file,
)
from train.data.tokenizers import Vocabulary, open_tokenizer
from train.formats import sources
from train.formats.corpora.splits import read_splits

# The validation conversations as the end of a run answers them (one JSON object a line).
HELD_OUT = "valid_held_out.jsonl"
# The corpus file the user's own validation and test files are read as (`Task.file_corpus`).
_FILE_CORPUS = "chat"


def chat_store_settings(data, vocabulary: Vocabulary) -> dict:
    """What a chat store is prepared for: a language model's settings (`store_settings`)
    and what decides a conversation's ids and mask (see the module docstring).

    Raises:
        ValueError: not a pretrained model's vocabulary, or a template file that does not
            read.
    """
    if vocabulary.opened is None:
        raise ValueError(
            f"--config.tokenizer={vocabulary.kind!r}: a chat store renders conversations with "
            "a pretrained model's template; use --config.tokenizer='pretrained' with "
            "--config.init_from."
        )
    template = source_chat_template(vocabulary.opened, data.chat_template or None)
    identity = json.dumps([template.source, dict(template.special_tokens)], sort_keys=True)
    return store_settings(data, vocabulary) | {
        "task": data.task,
        "chat_template": hashlib.sha256(identity.encode()).hexdigest(),
        "train_on": data.train_on,
        "max_len": data.max_len,
        "hf_dataset": data.corpora.hf.dataset,
        "hf_config": data.corpora.hf.config,
        "hf_split": data.corpora.hf.split,
    }


def prepare_chat_store(
    data, vocabulary: Vocabulary, processes: Processes = ONE_PROCESS
) -> tuple[TokenStore, bool]:
    """A chat run's store, opened, and prepared first where it is missing (by process 0;
    the others wait, then open it).

    Args:
        data: the data section (task 'chat', its store_dir set).
        vocabulary: the run's ids (`train.data.tokenizers.vocabulary`; its source is the
            pretrained model whose template renders the conversations).
        processes: this process's part.

    Returns:
        (the open store, whether this call prepared it: the counts were logged then).

    Raises:
        StoreError: a store of other settings (names the setting), or one begun from others.
        ValueError: as the in-memory run: a conversation refused, every one dropped.
        StoreWriteError: a write failed.
    """
    store_dir = pathlib.Path(data.store_dir)
    settings = chat_store_settings(data, vocabulary)
    if (store_dir / MANIFEST).is_file():
        return TokenStore.open(store_dir, settings), False
    logging.info("No token store in %s: preparing it from the conversations.", store_dir)
    if processes.primary:
        _prepare(data, vocabulary, settings)
    processes.barrier("chat-store")
    return TokenStore.open(store_dir, settings), True


def _prepare(data, vocabulary: Vocabulary, settings: dict) -> TokenStore:
    store_dir = pathlib.Path(data.store_dir)
    # plan.json (which guards a half-written store against other settings) and the copy
    # of the model's tokenizer, as a language model's store has them.
    try:
        begin_store(store_dir, settings, [{"corpus": data.corpus, "task": data.task}])
        copy = tokenizer_path(store_dir, data.tokenizer)
        if not (copy / sources.CONFIG_FILE).is_file():
            sources.snapshot(vocabulary.opened, copy)
    except OSError as err:
        raise StoreWriteError(
            f"could not write the token store {store_dir} ({err}) ; fix the cause and rerun."
        ) from err
    # The run's open source (the store's copy is of the same tokenizer: its settings say so).
    source = vocabulary.opened
    tokenizer = open_tokenizer(
        data.tokenizer, vocabulary.size, tokenizer_path(store_dir, data.tokenizer), source=source
    )
    encoder = run_chat_encoder(
        tokenizer,
        source,
        train_on=data.train_on,
        chat_template=data.chat_template,
        init_from=data.init_from,
    )
    splits = read_splits(data, _FILE_CORPUS)
    if not splits.train or not splits.valid:
        raise ValueError(
            f"The corpus split into {len(splits.train)} train and {len(splits.valid)} "
            f"validation examples; both must be non-empty: use a larger corpus or raise "
            f"--config.valid_fraction={data.valid_fraction}."
        )
    encoded = {}
    for split, conversations in (("train", splits.train), ("valid", splits.valid)):
        examples, kept, counts = encode_conversations(encoder, conversations, data.max_len, split)
        flat = np.concatenate([e.ids for e in examples]).astype(np.int64)
        name = "train" if split == "train" else "validation"
        check_token_range(flat, vocabulary.size, f"{name} split token ids")
        encoded[split] = (examples, kept, counts)
    sizes = {
        "train": len(encoded["train"][0]),
        "copied": 0,
        "valid": len(encoded["valid"][0]),
        "test": len(splits.test),
        "dropped_too_long": 0,  # encode_conversations cut or dropped every long one
        **encoded["train"][2].sizes("train"),
        **encoded["valid"][2].sizes("valid"),
    }
    chat = {
        "sizes": sizes,
        "log": [encoded[split][2].describe(split) for split in ("train", "valid")],
    }
    valid_examples, valid_kept, _ = encoded["valid"]
    held = held_out(encoder, valid_kept)
    try:
        _write_shard(store_dir, settings, encoded, held, len(splits.test))
        return finish_store(store_dir, 1, settings, chat)
    except OSError as err:
        raise StoreWriteError(
            f"could not write the token store {store_dir} ({err}) ; free disk space or fix "
            "the cause, then rerun the same command."
        ) from err


def _write_shard(store_dir: pathlib.Path, settings: dict, encoded: dict, held, test: int):
    """Writes shard 00000 (via a temporary directory, renamed when whole)."""
    final = store_dir / SHARDS / shard_name(0)
    if (final / SHARD_META).is_file():  # a whole shard whose manifest was not written
        return
    shutil.rmtree(final, ignore_errors=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    os.chmod(tmp, 0o777 & ~umask())
    try:
        dtype = token_dtype(settings["vocab_size"])
        meta = {"name": final.name, "source": {"task": "chat"}, "splits": {}, "files": {}}
        for split, (examples, kept, _) in encoded.items():
            tokens_name, docs_name = split_files(split)
            lengths = np.fromiter((e.num_tokens for e in examples), np.int64, len(examples))
            starts = np.cumsum(lengths) - lengths
            ids = np.concatenate([e.ids for e in examples]).astype(dtype)
            mask = np.concatenate([e.mask for e in examples]).astype(np.uint8)
            (tmp / tokens_name).write_bytes(ids.tobytes())
            (tmp / docs_name).write_bytes(starts.astype("<i8").tobytes())
            (tmp / mask_file(split)).write_bytes(mask.tobytes())
            chars = sum(len(m["content"]) for c in kept for m in c.messages)
            meta["splits"][split] = {"tokens": int(lengths.sum()), "docs": len(examples)}
            meta["splits"][split]["chars"] = chars
        lines = [
            json.dumps(
                {
                    "messages": [dict(m) for m in h.conversation.messages],
                    "where": h.conversation.where,
                    "split_key": h.conversation.split_key,
                    "prompt_ids": list(h.prompt_ids),
                    "stop_ids": list(h.stop_ids),
                },
                ensure_ascii=False,
            )
            for h in held
        ]
        (tmp / HELD_OUT).write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        for path in sorted(tmp.iterdir()):
            meta["files"][path.name] = {
                "bytes": path.stat().st_size,
                "sha256": file_sha256(path),
            }
        meta["test_docs"] = test
        write_json_file(tmp / SHARD_META, meta)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def read_held_out(store: TokenStore) -> list[dict]:
    """The records of the store's `valid_held_out.jsonl` (see the module docstring).

    Raises:
        StoreError: the store has no such file (not a chat store).
    """
    path = store.path / SHARDS / shard_name(0) / HELD_OUT
    if not path.is_file():
        raise StoreError(f"{store.path} holds no {HELD_OUT} ; prepare it again as a chat store.")
    try:
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise StoreError(f"{path} cannot be read ({err}) ; prepare the store again.") from err
