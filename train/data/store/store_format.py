"""The token store's format: its file names and layout, the dtype of its ids, what it is
prepared for (`store_settings`, compared by `check_settings`), and the checksums and JSON
files it is checked and finished with. `train.data.store.token_store` opens, reads, begins
and finishes stores in this format. Layout:

    <store_dir>/
      plan.json                the inputs and settings the store is prepared from
      tokenizer.model          the SentencePiece model (absent for the byte tokenizer)
      pretrained/              a pretrained model's tokenizer files (tokenizer 'pretrained')
      shards/00000/            one directory per shard of the input, written whole then renamed
        train.bin              the train documents' ids, each as BOS ids EOS (ids EOS for a
                               tokenizer that starts a sequence with no BOS), end to end
        train_docs.bin         int64 offset of each train document's first token
        valid.bin, valid_docs.bin   the same for the validation documents
        shard.json             counts, byte sizes and SHA-256 of the four files
      store.json               the manifest, written last: its presence means the store is whole

A chat store (`train.data.chat.store`: conversations rendered by the model's chat template)
has one shard whose splits hold each kept conversation's ids (nothing added around them) and
beside them `train_mask.bin` / `valid_mask.bin`, one uint8 per token (1: the token is a label
of the loss), at the same offsets; `valid_held_out.jsonl` keeps the validation conversations
as the end of a run asks the model to answer them, and the manifest's `chat` entry the
counts the in-memory run logs (conversations kept, cut, dropped by reason; tokens trained).
A language model's store has none of these: its files and manifest are as they always were.

Ids are stored as little-endian uint16 when the vocabulary fits, else uint32. A split's token
stream is its shards' streams end to end, in shard order; documents are never reordered
(shuffling happens over windows, when reading).
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import tempfile
from collections.abc import Mapping

import numpy as np

from train.data.tokenizers import Vocabulary
from train.formats.corpora import get_corpus

# Written into every manifest; a store of another format is refused with the fix.
STORE_FORMAT = 1
MANIFEST = "store.json"
PLAN = "plan.json"
TOKENIZER_FILE = "tokenizer.model"
PRETRAINED = (
    "pretrained"  # the copy of a pretrained model's tokenizer (`train.formats.sources.snapshot`)
)
SHARDS = "shards"
SHARD_META = "shard.json"
SPLITS = ("train", "valid")
# Largest vocabulary whose ids fit uint16.
UINT16_VOCAB = 1 << 16
# Bytes hashed per read while checking a file (bounded memory).
_HASH_CHUNK = 16 << 20


class StoreError(ValueError):
    """A token store that is missing, incomplete, damaged or prepared for another config."""


def token_dtype(vocab_size: int) -> np.dtype:
    """The on-disk dtype of a vocabulary's ids: uint16 up to 65,536 ids, else uint32."""
    return np.dtype("<u2") if vocab_size <= UINT16_VOCAB else np.dtype("<u4")


def shard_name(index: int) -> str:
    return f"{index:05d}"


def file_sha256(path: pathlib.Path) -> str:
    """The SHA-256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def split_files(split: str) -> tuple[str, str]:
    """The token file and the document-offset file of a split."""
    return f"{split}.bin", f"{split}_docs.bin"


def mask_file(split: str) -> str:
    """The loss-mask file of a chat store's split (one uint8 per token)."""
    return f"{split}_mask.bin"


def store_settings(data, vocabulary: Vocabulary) -> dict:
    """What a store is prepared for: what `TokenStore.open` compares.

    Args:
        data: the data section (`train.config.sections.DataConfig`).
        vocabulary: the run's ids (`train.data.tokenizers.vocabulary`): the model's
            vocabulary size and, for a pretrained model, what its tokenizer's ids mean.
    """
    return {
        "corpus": data.corpus,
        "corpus_path": data.corpus_path if get_corpus(data.corpus).reads_files else "",
        "text_field": data.corpora.text.field,
        "tokenizer": data.tokenizer,
        "vocab_size": vocabulary.size,
        "valid_fraction": data.valid_fraction,
        "test_fraction": data.test_fraction,
        "sample_chars": data.store_sample_chars if data.tokenizer == "sentencepiece" else 0,
        "collapse_whitespace": data.collapses_whitespace,
        "text_documents": data.corpora.text.documents,
        "valid_path": data.valid_path,
        "test_path": data.test_path,
        "pretrained_tokenizer": vocabulary.identity,
        "starts_with_bos": vocabulary.starts_with_bos,
    }


def tokenizer_path(store_dir: str | os.PathLike, kind: str) -> pathlib.Path:
    """Where a store's tokenizer of `kind` is read from (`train.data.tokenizers.open_tokenizer`):
    its SentencePiece model, or its copy of the pretrained model's tokenizer; the store
    itself for bytes, which read no file."""
    store_dir = pathlib.Path(store_dir)
    if kind == "sentencepiece":
        return store_dir / TOKENIZER_FILE
    if kind == "pretrained":
        return store_dir / PRETRAINED
    return store_dir


# What a store prepared before a setting existed was prepared with (`check_settings`).
_SETTINGS_BEFORE = {
    "collapse_whitespace": True,
    "text_documents": "lines",
    "valid_path": "",
    "test_path": "",
    "pretrained_tokenizer": "",
    "starts_with_bos": True,
}


def read_json_file(path: pathlib.Path, fix: str) -> dict:
    """A JSON file of the store, or StoreError naming it and `fix`."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise StoreError(f"{path} cannot be read ({err}) ; {fix}.") from err


def check_settings(path: pathlib.Path, saved: Mapping, wanted: Mapping) -> None:
    """Raises StoreError naming the first setting a store was prepared with that differs."""
    for name, value in wanted.items():
        was = saved.get(name, _SETTINGS_BEFORE.get(name))
        if (
            was != value
            and name in ("vocab_size", "pretrained_tokenizer", "starts_with_bos")
            and (wanted.get("tokenizer") == "pretrained")
        ):
            raise StoreError(
                f"the token store {path} holds the ids of another tokenizer ({name} "
                f"{was!r}, --config.init_from's model has {value!r}) ; prepare a new store "
                "into another --config.store_dir for this model."
            )
        if was != value and name == "chat_template":  # a hash (train.data.chat.store)
            raise StoreError(
                f"the token store {path} was prepared with another chat template (SHA-256 "
                f"{str(was)[:12]}...) ; give the template it was made with "
                "(--config.chat_template, or '' for the model's own), or prepare a new store "
                "into another --config.store_dir."
            )
        if was != value:
            raise StoreError(
                f"the token store {path} was prepared with {name}={was!r}, the config "
                f"asks for {value!r} ; set --config.{name}={was!r}, or prepare a new "
                "store into another --config.store_dir."
            )


def umask() -> int:
    """The process's file mode creation mask (read without changing it)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_json_file(path: pathlib.Path, value) -> None:
    """Writes JSON atomically (temporary file, fsync, rename)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.fchmod(fd, 0o666 & ~umask())
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(value, f, indent=1, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
