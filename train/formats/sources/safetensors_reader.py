"""The tensors of a Hugging Face model directory's safetensors file(s), read with plain file
reads (no `safetensors` or torch at run time): `HFSource.tensor_reader()`, and
`train.export`'s check of what it wrote.

The format (huggingface/safetensors): an 8-byte little-endian header length, a JSON header
naming each tensor's dtype, shape and byte range, then the bytes.
"""

from __future__ import annotations

import json
import pathlib

import jax.numpy as jnp
import numpy as np

WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX_FILE = "model.safetensors.index.json"

# safetensors dtype names -> numpy dtypes (bfloat16 through ml_dtypes, a jax dependency).
_SAFETENSORS_DTYPES = {
    "F64": np.float64,
    "F32": np.float32,
    "F16": np.float16,
    "BF16": jnp.bfloat16,
    "I64": np.int64,
    "I32": np.int32,
    "I16": np.int16,
    "I8": np.int8,
    "U8": np.uint8,
    "BOOL": np.bool_,
}


class SafetensorsReader:
    """The tensors of a model directory's safetensors file(s), each read on request into a
    fresh numpy array (no memory map: the host keeps only the arrays asked for); a
    `train.formats.sources.base.TensorReader`."""

    def __init__(self, directory: pathlib.Path):
        index = directory / WEIGHTS_INDEX_FILE
        if index.is_file():
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            files = sorted(set(weight_map.values()))
        else:
            files = [WEIGHTS_FILE]
        self._where: dict[str, tuple[pathlib.Path, int, dict]] = {}
        for name in files:
            path = directory / name
            with open(path, "rb") as f:
                size = int.from_bytes(f.read(8), "little")
                header = json.loads(f.read(size))
            header.pop("__metadata__", None)
            for key, info in header.items():
                self._where[key] = (path, 8 + size, info)
        self.bytes_on_disk = sum((directory / name).stat().st_size for name in files)

    def keys(self) -> set[str]:
        return set(self._where)

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def get(self, name: str) -> np.ndarray:
        path, offset, info = self._where[name]
        if info["dtype"] not in _SAFETENSORS_DTYPES:
            raise ValueError(f"{path}: tensor {name} has dtype {info['dtype']}, not supported.")
        start, stop = info["data_offsets"]
        out = np.empty(info["shape"], _SAFETENSORS_DTYPES[info["dtype"]])
        if out.nbytes != stop - start:
            raise ValueError(f"{path}: tensor {name} holds {stop - start} bytes, not {out.nbytes}.")
        with open(path, "rb") as f:
            f.seek(offset + start)
            f.readinto(memoryview(out.reshape(-1).view(np.uint8)))
        return out
