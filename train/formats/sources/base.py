"""What every kind of pretrained source answers, and the entry that registers a kind.

A kind is a `Kind` in `train.formats.sources.KINDS`: whether a path is of that kind
(`detect`) and how to read it (`read`). What it reads is a `Source`, which answers the floors
above under the same names whatever its kind:

    model                the model config (a `TransformerConfig`)
    tensor_reader()      its weights, tensor by tensor (`TensorReader`), named as `family` says:
                         'gpt2' / 'llama' (Hugging Face names, through the library's importer
                         of that family, which also reads the source's `hf_config`, its
                         config.json) or `OWN_PARAMS` (the model's own parameter paths)
    tokenizer_files()    its Hugging Face tokenizer (`TokenizerFiles`)
    chat_files()         where its chat template is found (`ChatFiles`)
    copy_files(target)   its small files, for a run's snapshot (`train.formats.sources.snapshot`)
    tokenizer_sha256()   what its ids mean
    trained_here         True for a `train.main` run directory: its model config, tokenizer
                         and weights are the program's own formats, read by the floors above
                         this package (`train.config.config_lib.read_saved`,
                         `train.data.tokenizers.open_tokenizer`,
                         `train.program.trained.load_trained`), which test this attribute.

The base class `Source` answers all but `model` and `tensor_reader()` for a directory that
keeps its config and a Hugging Face tokenizer as `save_pretrained` writes them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import pathlib
import shutil
from collections.abc import Callable, Collection, Mapping
from typing import Any, ClassVar, Protocol

import numpy as np

CONFIG_FILE = "config.json"
TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
# Where transformers 5 saves a model's chat template (beside tokenizer_config.json, which then
# holds none; `train.data.chat.template`).
CHAT_TEMPLATE_FILE = "chat_template.jinja"
# Where older tokenizers keep their special tokens (transformers reads it over
# tokenizer_config.json's where the config lists no `added_tokens_decoder`).
SPECIAL_TOKENS_MAP_FILE = "special_tokens_map.json"
# The files of a Hugging Face tokenizer: copied with a run (`train.formats.sources.snapshot`) and
# written by `train.export`.
TOKENIZER_FILES = (
    TOKENIZER_FILE,
    TOKENIZER_CONFIG_FILE,
    CHAT_TEMPLATE_FILE,
    SPECIAL_TOKENS_MAP_FILE,
    "generation_config.json",
)
# The `family` of a source whose tensors are named by the model's own parameter paths, joined
# by '/' ('decoder/layers_0/attention/query/kernel'), in the layout of its `model`.
OWN_PARAMS = "params"


def fail(path: Any, expected: str) -> ValueError:
    """The error for a source that cannot be read: `--config.init_from=<path>: <expected>.`"""
    return ValueError(f"--config.init_from={str(path)!r}: {expected}.")


def copy_file(source: pathlib.Path, target: pathlib.Path) -> None:
    """Copies a file through a temporary name, so `target` is whole or absent."""
    shutil.copyfile(source, target.with_name(f"{target.name}.tmp"))
    target.with_name(f"{target.name}.tmp").replace(target)


def read_config_json(directory: pathlib.Path) -> Any:
    """A directory's config.json, parsed.

    Raises:
        ValueError: no config.json, or not readable JSON (names the path).
    """
    path = directory / CONFIG_FILE
    if not path.is_file():
        raise fail(directory, f"no {CONFIG_FILE}: not a save_pretrained directory")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise fail(directory, f"{CONFIG_FILE} is not readable JSON ({err})") from None


def config_json_or_none(path: pathlib.Path) -> Any:
    """A directory's parsed config.json, or None where `path` is no directory holding a
    readable one (what a kind's `detect` asks; `read_config_json` says what is wrong)."""
    if not path.is_dir():
        return None
    try:
        return read_config_json(path)
    except ValueError:
        return None


def read_json_object(path: pathlib.Path) -> dict[str, Any]:
    """A tokenizer file's JSON object ({} where the file is absent).

    Raises:
        ValueError: a file that is not a readable JSON object (names it).
    """
    if not path.is_file():
        return {}
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: not readable JSON ({err}).") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path}: not a JSON object.")
    return value


class TensorReader(Protocol):
    """A source's weights, each tensor read on request (the host keeps only those asked
    for): `SafetensorsReader`, `GGUFTensors`, `ArrayReader`."""

    bytes_on_disk: int

    def keys(self) -> Collection[str]: ...

    def __contains__(self, name: str) -> bool: ...

    def get(self, name: str) -> np.ndarray: ...


class ArrayReader:
    """A `TensorReader` over a mapping of name -> array (e.g. `numpy.load` of a .npz file,
    which reads an array when asked for it)."""

    def __init__(self, arrays: Mapping[str, Any], bytes_on_disk: int):
        self._arrays, self.bytes_on_disk = arrays, bytes_on_disk

    def keys(self) -> Collection[str]:
        return set(self._arrays.keys())

    def __contains__(self, name: str) -> bool:
        return name in self._arrays

    def get(self, name: str) -> np.ndarray:
        return np.asarray(self._arrays[name])


@dataclasses.dataclass(frozen=True)
class TokenizerFiles:
    """A Hugging Face tokenizer as a source holds it (read by
    `train.data.hf_tokenizer.PretrainedTokenizer`).

    Attributes:
        tokenizer_json: `tokenizer.json`'s text.
        model_config: the model's config.json (its `bos_token_id`, `eos_token_id`).
        tokenizer_config: tokenizer_config.json (`bos_token`, `eos_token`, `unk_token`,
            `add_bos_token`...).
        where: where the tokenizer was read (named in errors).
    """

    tokenizer_json: str
    model_config: Mapping[str, Any]
    tokenizer_config: Mapping[str, Any]
    where: pathlib.Path


@dataclasses.dataclass(frozen=True)
class ChatFiles:
    """Where a source's chat template is found (`train.data.chat.template.find_chat_template`).

    Attributes:
        tokenizer_config: tokenizer_config.json (its `chat_template` and special tokens).
        directory: the directory that may hold a `chat_template.jinja`; None for none.
    """

    tokenizer_config: Mapping[str, Any]
    directory: pathlib.Path | None


class Source:
    """A pretrained source of any kind (see the module docstring); its defaults read a
    directory that keeps `config.json` and a Hugging Face tokenizer (`TOKENIZER_FILES`).

    Attributes:
        path: the directory or file.
        family: the model family ('gpt2', 'llama', `OWN_PARAMS`; 'run' for a run), recorded
            with a run's snapshot; it names the weights' tensors (`tensor_reader`).
        model: the model config (every kind but a run, which `trained_here` says).
    """

    path: pathlib.Path
    family: str
    model: Any
    trained_here: ClassVar[bool] = False

    @property
    def config_origin(self) -> pathlib.Path:
        """Where the model config was read (named in errors)."""
        return self.path / CONFIG_FILE

    def tensor_reader(self) -> TensorReader:
        """The weights, tensor by tensor."""
        raise NotImplementedError(f"{type(self).__name__} reads no weights")

    def tokenizer_files(self) -> TokenizerFiles:
        """`tokenizer.json` with config.json and tokenizer_config.json.

        Raises:
            ValueError: no tokenizer.json (names it and how to write one).
        """
        path = self.path / TOKENIZER_FILE
        if not path.is_file():
            raise ValueError(
                f"{path} not found: --config.tokenizer='pretrained' reads the model's "
                "tokenizer.json (save_pretrained writes it: tokenizer.save_pretrained(dir))."
            )
        return TokenizerFiles(
            path.read_text(encoding="utf-8"),
            _plain_json(self.path / CONFIG_FILE),
            _plain_json(self.path / TOKENIZER_CONFIG_FILE),
            self.path,
        )

    def chat_files(self) -> ChatFiles:
        """tokenizer_config.json (over an older save's special_tokens_map.json, as
        transformers reads both) and the directory, which may hold chat_template.jinja.

        Raises:
            ValueError: a tokenizer file that is not a readable JSON object.
        """
        config = read_json_object(self.path / TOKENIZER_CONFIG_FILE)
        if "added_tokens_decoder" not in config:  # an older save: transformers reads both
            config = {**config, **read_json_object(self.path / SPECIAL_TOKENS_MAP_FILE)}
        return ChatFiles(config, self.path)

    def copy_files(self, target: pathlib.Path) -> None:
        """Copies the config and tokenizer files into `target` (a run's snapshot)."""
        for name in (CONFIG_FILE, *TOKENIZER_FILES):
            if (self.path / name).is_file():
                copy_file(self.path / name, target / name)

    def tokenizer_sha256(self) -> str:
        """The SHA-256 of `tokenizer.json`: what the model's ids mean."""
        return hashlib.sha256((self.path / TOKENIZER_FILE).read_bytes()).hexdigest()


def _plain_json(path: pathlib.Path) -> dict:
    """A file's JSON ({} where absent), as `PretrainedTokenizer` has always read it."""
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


@dataclasses.dataclass(frozen=True)
class Kind:
    """One kind of pretrained source, as `train.formats.sources.KINDS` lists it.

    Attributes:
        name: the kind, as messages name it.
        detect: whether a path (a directory or a file) is of this kind; never raises.
        read: the `Source` at a path `detect` accepted, checked; `need_weights` also checks
            that the weights are there. Raises ValueError naming the path and the fix.
    """

    name: str
    detect: Callable[[pathlib.Path], bool]
    read: Callable[[pathlib.Path, bool], Source]
