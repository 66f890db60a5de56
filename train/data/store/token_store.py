"""A corpus tokenized once: the token store on disk, begun and finished by its writers, and
its windows read back by memory map.

`python -m train.prepare` (`train.data.store.store_prepare`) writes a store; a run whose data
section names one (`--config.store_dir`) reads it through `train.data.store.store_pipeline`.
Its layout, file names and settings are `train.data.store.store_format`'s, re-exported here
where the store's writers and readers import them.

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
from collections.abc import Mapping, Sequence

import numpy as np

from train.data.store.store_format import (
    MANIFEST,
    PLAN,
    PRETRAINED,
    SHARD_META,
    SHARDS,
    SPLITS,
    STORE_FORMAT,
    TOKENIZER_FILE,
    UINT16_VOCAB,
    StoreError,
    check_settings,
    file_sha256,
    mask_file,
    read_json_file,
    shard_name,
    split_files,
    store_settings,
    token_dtype,
    tokenizer_path,
    umask,
    write_json_file,
)

__all__ = [
    "MANIFEST",
    "PLAN",
    "PRETRAINED",
    "SHARD_META",
    "SHARDS",
    "SPLITS",
    "STORE_FORMAT",
    "TOKENIZER_FILE",
    "UINT16_VOCAB",
    "StoreError",
    "TokenStore",
    "begin_store",
    "check_settings",
    "file_sha256",
    "finish_store",
    "mask_file",
    "read_json_file",
    "shard_name",
    "split_files",
    "store_settings",
    "token_dtype",
    "tokenizer_path",
    "umask",
    "write_json_file",
]


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
