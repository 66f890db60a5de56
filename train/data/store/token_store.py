"""A corpus tokenized once: the token store on disk, and its windows read back by memory map.

`python -m train.prepare` (`train.data.store.store_prepare`) writes a store; a run whose data
section names one (`--config.store_dir`) reads it through `train.data.store.store_pipeline`. Layout:

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

Opening a store (`TokenStore.open`) checks that its tokenizer, vocabulary, split fractions,
own validation and test files, document mode and whitespace rule are the ones the config
asks for (`store_settings`), that every file has the size the manifest says (a truncated
shard) and its SHA-256 (a damaged one; about 0.25 s per 100M tokens, in threads), and maps the
token files without reading them: memory does not grow with the corpus, except for the
document offsets (8 bytes per document).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import json
import os
import pathlib
import tempfile
from collections.abc import Mapping, Sequence

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
        "text_field": data.text_field,
        "tokenizer": data.tokenizer,
        "vocab_size": vocabulary.size,
        "valid_fraction": data.valid_fraction,
        "test_fraction": data.test_fraction,
        "sample_chars": data.store_sample_chars if data.tokenizer == "sentencepiece" else 0,
        "collapse_whitespace": data.collapses_whitespace,
        "text_documents": data.text_documents,
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


@dataclasses.dataclass(frozen=True)
class _Split:
    """One split of an open store: the shards' token maps and the documents' offsets."""

    tokens: tuple[np.ndarray, ...]  # per shard, memory-mapped
    masks: tuple[np.ndarray, ...] | None  # per shard, memory-mapped uint8 (chat stores only)
    shard_starts: np.ndarray  # int64 (S + 1,): offset of each shard in the split's stream
    doc_starts: np.ndarray  # int64 (D,): offset of each document in the split's stream
    num_chars: int  # characters of the split's documents, one line break each

    @property
    def num_tokens(self) -> int:
        return int(self.shard_starts[-1])


class TokenStore:
    """An open token store (see the module docstring); read with `read` and `documents_of`."""

    def __init__(self, path: pathlib.Path, manifest: dict, splits: Mapping[str, _Split]):
        self.path = path
        self.manifest = manifest
        self._splits = dict(splits)

    @classmethod
    def open(cls, path: str | os.PathLike, settings: Mapping | None = None) -> TokenStore:
        """Opens a whole store, checking it against the config and its own checksums.

        Args:
            path: the store directory (`--config.store_dir`).
            settings: `store_settings(data)` of the run; None skips the comparison.

        Raises:
            StoreError: no manifest (never prepared, or unfinished), another format or
                settings than the config's, a file of the wrong size or checksum (names the
                shard and the fix).
        """
        path = pathlib.Path(path)
        manifest_path = path / MANIFEST
        if not manifest_path.is_file():
            raise StoreError(
                f"{path} holds no finished token store ({MANIFEST} missing) ; run "
                "`python -m train.prepare` with the run's --config flags (it finishes what an "
                "interrupted preparation left), or let train.main prepare it."
            )
        manifest = read_json_file(manifest_path, "rerun `python -m train.prepare` to rewrite it")
        if manifest.get("format") != STORE_FORMAT:
            raise StoreError(
                f"{path} is a token store of format {manifest.get('format')!r}, this program "
                f"reads format {STORE_FORMAT} ; prepare it again into a new --config.store_dir."
            )
        if settings is not None:
            check_settings(path, manifest["settings"], settings)
        dtype = np.dtype(manifest["dtype"])
        shards = manifest["shards"]
        _check_files(path, shards)
        splits = {split: _open_split(path, shards, split, dtype) for split in SPLITS}
        return cls(path, manifest, splits)

    @property
    def fingerprint(self) -> dict:
        """Sizes and a hash of the store's content (a resumed run must read the same)."""
        digest = hashlib.sha256(json.dumps(self.manifest["shards"], sort_keys=True).encode())
        return {
            "store_train_tokens": self.num_tokens("train"),
            "store_valid_tokens": self.num_tokens("valid"),
            "sha256": digest.hexdigest(),
        }

    def num_tokens(self, split: str) -> int:
        return self._splits[split].num_tokens

    def num_documents(self, split: str) -> int:
        return len(self._splits[split].doc_starts)

    def num_chars(self, split: str) -> int:
        return self._splits[split].num_chars

    def read(self, split: str, start: int, stop: int) -> np.ndarray:
        """Tokens [start, stop) of a split's stream as int32, across shard boundaries."""
        part = self._splits[split]
        return _read(part, part.tokens, split, start, stop).astype(np.int32)

    @property
    def has_masks(self) -> bool:
        """Whether the store keeps a loss mask beside its ids (a chat store)."""
        return self._splits["train"].masks is not None

    def read_mask(self, split: str, start: int, stop: int) -> np.ndarray:
        """bool (stop - start,): the loss mask of tokens [start, stop) of a chat store.

        Raises:
            StoreError: the store keeps no mask (a language model's).
        """
        part = self._splits[split]
        if part.masks is None:
            raise StoreError(f"the token store {self.path} keeps no loss mask (not a chat store).")
        return _read(part, part.masks, split, start, stop).astype(bool)

    def document_starts(self, split: str) -> np.ndarray:
        """int64 (D,): the offset of each document's (conversation's) first token."""
        return self._splits[split].doc_starts

    def documents_of(self, split: str, start: int, stop: int) -> np.ndarray:
        """int64 (stop - start,): the index of the document each token of [start, stop) is in."""
        return np.searchsorted(self._splits[split].doc_starts, np.arange(start, stop), "right") - 1


def _read(part: _Split, maps, split: str, start: int, stop: int) -> np.ndarray:
    """Entries [start, stop) of a split's per-shard `maps`, across shard boundaries."""
    if not 0 <= start <= stop <= part.num_tokens:
        raise IndexError(f"tokens [{start}, {stop}) outside {split}'s {part.num_tokens}.")
    first = int(np.searchsorted(part.shard_starts, start, side="right")) - 1
    pieces, position = [], start
    shard = first
    while position < stop:
        begin = int(part.shard_starts[shard])
        end = min(stop, int(part.shard_starts[shard + 1]))
        pieces.append(maps[shard][position - begin : end - begin])
        position, shard = end, shard + 1
    if not pieces:
        return np.zeros((0,), maps[0].dtype if maps else np.int32)
    return np.concatenate(pieces)


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


def _check_files(path: pathlib.Path, shards: Sequence[dict]) -> None:
    """Every shard file exists with its size and checksum (hashed in threads)."""
    expected = []
    for shard in shards:
        for name, record in shard["files"].items():
            file = path / SHARDS / shard["name"] / name
            size = file.stat().st_size if file.is_file() else None
            if size != record["bytes"]:
                raise StoreError(
                    f"shard {shard['name']} of the token store {path} is damaged: {file} has "
                    f"{size} bytes, the manifest says {record['bytes']} ; delete "
                    f"{path / SHARDS / shard['name']} and {path / MANIFEST} and rerun "
                    "`python -m train.prepare`: it rewrites that shard only."
                )
            expected.append((shard["name"], file, record["sha256"]))
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        sums = list(pool.map(file_sha256, [file for _, file, _ in expected]))
    for (name, file, want), got in zip(expected, sums, strict=True):
        if got != want:
            raise StoreError(
                f"shard {name} of the token store {path} is damaged: {file} has SHA-256 "
                f"{got[:12]}..., the manifest says {want[:12]}... ; delete {file.parent} and "
                f"{path / MANIFEST} and rerun `python -m train.prepare`: it rewrites that "
                "shard only."
            )


def _open_split(path: pathlib.Path, shards: Sequence[dict], split: str, dtype) -> _Split:
    tokens_file, docs_file = split_files(split)
    maps, sizes, docs, chars = [], [], [], 0
    with_masks = all(mask_file(split) in shard["files"] for shard in shards) and bool(shards)
    masks = []
    offset = 0
    for shard in shards:
        folder = path / SHARDS / shard["name"]
        count = shard["splits"][split]["tokens"]
        maps.append(_map(folder / tokens_file, dtype, count))
        if with_masks:
            masks.append(_map(folder / mask_file(split), np.dtype("u1"), count))
        docs.append(np.fromfile(folder / docs_file, dtype="<i8") + offset)
        sizes.append(count)
        offset += count
        chars += shard["splits"][split]["chars"]
    shard_starts = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)]).astype(np.int64)
    doc_starts = np.concatenate(docs) if docs else np.zeros((0,), np.int64)
    masks = tuple(masks) if with_masks else None
    return _Split(tuple(maps), masks, shard_starts, doc_starts.astype(np.int64), chars)


def _map(file: pathlib.Path, dtype: np.dtype, count: int) -> np.ndarray:
    """A file of `count` entries, memory-mapped (an empty array for none)."""
    if not count:
        return np.zeros((0,), dtype)
    return np.memmap(file, dtype=dtype, mode="r", shape=(count,))


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


def begin_store(store_dir: pathlib.Path, settings: dict, sources: Sequence[dict]) -> None:
    """Starts (or goes on with) a store: its shard directory, and plan.json, written where
    missing; a store begun from other inputs or settings is refused.

    Args:
        store_dir: the store directory.
        settings: `store_settings` of the run.
        sources: the shards' inputs (`train.data.store.store_inputs.Source` as dicts).

    Raises:
        StoreError: plan.json records other inputs or settings (names them).
        OSError: a write failed.
    """
    (store_dir / SHARDS).mkdir(parents=True, exist_ok=True)
    plan = {"format": STORE_FORMAT, "settings": settings, "sources": list(sources)}
    path = store_dir / PLAN
    if path.exists():
        saved = read_json_file(path, f"delete {store_dir} and prepare it again")
        if saved != plan:
            changed = [k for k in plan if saved.get(k) != plan[k]]
            raise StoreError(
                f"the token store {store_dir} was begun from other inputs or settings "
                f"({', '.join(changed)} differ) ; use another --config.store_dir, or delete "
                f"{store_dir} to prepare it again."
            )
        return
    write_json_file(path, plan)


def finish_store(
    store_dir: pathlib.Path, num_shards: int, settings: dict, chat: dict | None = None
) -> TokenStore:
    """Writes the manifest of a store whose shards are all there (it makes the store whole),
    and opens it.

    Args:
        store_dir, num_shards, settings: the store, its shard count, `store_settings`.
        chat: a chat store's counts (the manifest's `chat` entry); None for a language
            model's store, whose manifest has no such entry.

    Raises:
        StoreError: a shard's shard.json does not read.
        OSError: the write failed.
    """
    shards = []
    for i in range(num_shards):
        meta = read_json_file(
            store_dir / SHARDS / shard_name(i) / SHARD_META,
            f"delete {store_dir / SHARDS / shard_name(i)} and rerun to rewrite that shard",
        )
        shards.append({k: meta[k] for k in ("name", "splits", "files", "test_docs")})
    tokenizer_sha = (
        file_sha256(store_dir / TOKENIZER_FILE) if settings["tokenizer"] == "sentencepiece" else ""
    )
    manifest = {
        "format": STORE_FORMAT,
        "settings": settings,
        "dtype": token_dtype(settings["vocab_size"]).str,
        "tokenizer_sha256": tokenizer_sha,
        "shards": shards,
        "totals": {
            split: {
                key: sum(s["splits"][split][key] for s in shards)
                for key in ("tokens", "docs", "chars")
            }
            for split in ("train", "valid")
        },
    }
    if chat is not None:
        manifest["chat"] = chat
    write_json_file(store_dir / MANIFEST, manifest)
    return TokenStore.open(store_dir, settings)
