"""The weights of a pretrained source (`train.formats.sources`), read and placed for a run of
`--config.init_from`.

The source gives its tensors (`Source.tensor_reader()`); this module converts and places them:
- a Hugging Face directory: `model.safetensors` or its shards (`model.safetensors.index.json`),
  read tensor by tensor with plain file reads (`train.formats.sources.safetensors_reader`)
  and handed to the library's per-layer importers (`flax_transformer.interop.gpt2`,
  `llama`) as if they were a torch module;
- a GGUF file: each tensor read the same way and dequantized under its Hugging Face name
  (`train.formats.sources.gguf.GGUFSource.read_tensor`), through the same Llama importer;
- a source whose tensors are named by the model's own parameter paths
  (`train.formats.sources.base.OWN_PARAMS`): each placed as it is;
- a `train.main` run (`Source.trained_here`): its newest parameters
  (`train.program.trained.load_trained`), LoRA adapters merged.
Each finished parameter is placed at once with the run's sharding
(`train.program.steps.create_train_state(..., pretrained=...)`), so the host holds one layer
in float32 at a time.
"""

from __future__ import annotations

import dataclasses
import functools
import types
from collections.abc import Iterator, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
from flax import traverse_util

from flax_transformer import DecoderOnlyTransformer, TransformerConfig, merge_lora
from flax_transformer.interop import gpt2, llama
from train.formats import sources
from train.formats.sources.base import OWN_PARAMS, TensorReader
from train.formats.sources.gguf import GGUFTensors
from train.formats.sources.safetensors_reader import SafetensorsReader
from train.program.trained import load_trained

# The readers' names of before they moved into train.formats.sources (`Source.tensor_reader`).
__all__ = ["GGUFTensors", "SafetensorsReader", "load_weights"]

Reader = TensorReader


class _LazyModule:
    """A dotted prefix of tensor names that answers like a torch module: `.weight` and
    `.bias` read the tensor, other attributes are submodules, and a numbered list of
    submodules (`h`, `layers`) iterates. Names the checkpoint lacks raise AttributeError
    (`getattr(module, 'bias', None)` is None), so the importers' checks still apply."""

    def __init__(self, reader: Reader, prefix: str):
        self._reader, self._prefix = reader, prefix

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        full = self._prefix + name
        if full in self._reader:
            return self._reader.get(full)
        if any(key.startswith(full + ".") for key in self._reader.keys()):
            return _LazyModule(self._reader, full + ".")
        raise AttributeError(f"{full}: not in the checkpoint")

    def __iter__(self) -> Iterator[_LazyModule]:
        indices = {
            int(key[len(self._prefix) :].split(".", 1)[0])
            for key in self._reader.keys()
            if key.startswith(self._prefix) and key[len(self._prefix) :].split(".", 1)[0].isdigit()
        }
        return iter(_LazyModule(self._reader, f"{self._prefix}{i}.") for i in sorted(indices))


def _lazy_model(source: sources.Source, reader: Reader) -> types.SimpleNamespace:
    """The checkpoint's layers as the objects the library's per-layer importers read
    (`body.h[i]` for GPT-2, `body.layers[i]` for Llama), and the tensor-name prefix of the
    body ('transformer.' / 'model.', or '' where the base model was saved alone)."""
    body = "transformer" if source.family == "gpt2" else "model"
    prefix = f"{body}." if any(k.startswith(f"{body}.") for k in reader.keys()) else ""
    return types.SimpleNamespace(body=_LazyModule(reader, prefix), body_prefix=prefix)


def load_weights(
    source: sources.Source, model: TransformerConfig, placement: Mapping | None = None
) -> tuple[dict, int]:
    """The checkpoint's parameters for a model of config `model` (the run's layout:
    scan_layers, param_dtype), and the bytes read from disk.

    Read layer by layer with the library's importers' per-layer conversions, so the host
    holds one layer in float32 at a time beside the parameters in their dtype; each finished
    parameter is placed at once (`placement`: parameter path tuple -> a leaf with a
    `.sharding`, e.g. the run's `train_state_shapes(...).params` flattened) and its host
    copy dropped. LoRA adapters and other parameters the checkpoint does not hold are not in
    the tree: `create_train_state` keeps their initial values.

    Raises:
        ValueError: a weight missing or of the wrong shape (named).
    """
    base = dataclasses.replace(model, **_without_adapters(model))
    dtype = np.dtype(base.param_dtype)
    if source.trained_here:  # an orbax checkpoint, restored by this floor
        return _load_run_weights(source, base, placement), 0
    reader = source.tensor_reader()

    def place(path: tuple[str, ...], array: np.ndarray):
        array = np.asarray(array).astype(dtype, copy=False)
        if placement is not None and path in placement:
            return jax.device_put(array, placement[path].sharding)
        return jnp.asarray(array)

    if source.family == OWN_PARAMS:  # the model's own parameter paths: nothing to convert
        out = {
            tuple(name.split("/")): place(tuple(name.split("/")), reader.get(name))
            for name in sorted(reader.keys())
        }
        _check_tree(out, base, source)
        return traverse_util.unflatten_dict(out), reader.bytes_on_disk
    lazy = _lazy_model(source, reader)
    try:
        top, layers = _read_checkpoint(source, lazy, reader, base)
        out = {path: place(path, read()) for path, read in top.items()}
        if base.scan_layers:  # one (L, ...) array per parameter, placed first, filled by layer
            for i, layer in enumerate(layers):
                for key, value in layer().items():
                    path = ("decoder", "layers", *key)
                    if path not in out:
                        shape = (base.decoder_layers, *value.shape)
                        out[path] = _zeros(shape, dtype, path, placement)
                    out[path] = _set_layer(out[path], np.int32(i), np.asarray(value).astype(dtype))
        else:
            for i, layer in enumerate(layers):
                for key, value in layer().items():
                    path = ("decoder", f"layers_{i}", *key)
                    out[path] = place(path, value)
    except AttributeError as err:
        raise ValueError(f"{source.path}: a weight the model needs is missing ({err})") from None
    _check_tree(out, base, source)
    return traverse_util.unflatten_dict(out), reader.bytes_on_disk


def _zeros(shape, dtype, path, placement) -> jax.Array:
    """A zero array placed as the parameter at `path` is (default device without one)."""
    sharding = placement[path].sharding if placement is not None and path in placement else None
    return jax.jit(lambda: jnp.zeros(shape, dtype), out_shardings=sharding)()


@functools.partial(jax.jit, donate_argnums=0)
def _set_layer(stack: jax.Array, index, value) -> jax.Array:
    """`stack` with layer `index` replaced by `value`, in place (donated)."""
    return jax.lax.dynamic_update_index_in_dim(stack, value, index, 0)


def relayout_layers(params: dict, scan_layers: bool) -> dict:
    """`params` with every stack of layers in the other layout: `layers_0`, `layers_1`, ...
    stacked into one `layers` tree on a leading axis (`scan_layers=True`, the layout
    `nn.scan` gives), or `layers` split into them (False). Numbered layers and a stacked
    `layers` are recognised at any depth (a decoder-only model's top, an encoder's and a
    decoder's stack); everything else is kept as it is."""
    if not isinstance(params, Mapping):
        return params
    numbered = sorted(
        (k for k in params if k.startswith("layers_") and k[7:].isdigit()), key=lambda k: int(k[7:])
    )
    out = {}
    if scan_layers and numbered:
        out["layers"] = jax.tree.map(lambda *xs: np.stack(xs), *(params[k] for k in numbered))
    stacked = not scan_layers and isinstance(params.get("layers"), Mapping)
    if stacked:
        count = len(jax.tree.leaves(params["layers"])[0])
        for i in range(count):
            out[f"layers_{i}"] = jax.tree.map(lambda x, i=i: np.asarray(x[i]), params["layers"])
    for key, value in params.items():
        if (scan_layers and key in numbered) or (stacked and key == "layers"):
            continue
        out[key] = relayout_layers(value, scan_layers)
    return out


def _load_run_weights(source: sources.Source, model: TransformerConfig, placement) -> dict:
    """The newest parameters of a train.main run (LoRA adapters merged into their
    weights), in `model`'s dtype and layout (a run of the other `scan_layers` is restacked,
    `relayout_layers`), placed as `placement` says."""
    trained = load_trained(source.path)
    config, params = trained.model.config, trained.params
    if getattr(config, "lora_rank", 0):
        config, params = merge_lora(config, params)
    if config.scan_layers != model.scan_layers:
        params = relayout_layers(params, model.scan_layers)
    dtype = np.dtype(model.param_dtype)
    out = {}
    for path, value in traverse_util.flatten_dict(params).items():
        value = jnp.asarray(value, dtype)
        if placement is not None and path in placement:
            value = jax.device_put(value, placement[path].sharding)
        out[path] = value
    return traverse_util.unflatten_dict(out)


def _read_checkpoint(source: sources.Source, lazy, reader: Reader, config: TransformerConfig):
    """The checkpoint's parameters outside the layers (path -> a callable giving the host
    array in the parameters' dtype) and one callable per layer giving that layer's
    (path within the layer -> host array)."""
    d, dtype = config.d_model, np.dtype(config.param_dtype)
    vocab = int(source.hf_config["vocab_size"])
    body_prefix = lazy.body_prefix

    def tensor(name: str, shape: tuple[int, ...]) -> np.ndarray:
        full = body_prefix + name if not name.startswith("lm_head") else name
        if full not in reader:
            raise AttributeError(f"{full}: not in the checkpoint")
        array = reader.get(full)
        if array.shape != shape:
            raise ValueError(f"{source.path}: {full} has shape {array.shape}, expected {shape}.")
        return array

    def table(name: str, transpose: bool = False):
        """A (V, D) table with zero rows for the added ids, in the parameters' dtype."""

        def read() -> np.ndarray:
            rows = tensor(name, (vocab, d))
            out = np.zeros((config.vocab_size, d), dtype)
            out[:vocab] = rows
            return out.T if transpose else out

        return read

    top: dict[tuple[str, ...], Any] = {}
    if source.family == "gpt2":
        blocks, prefix, convert = list(lazy.body.h), "h", gpt2._block_params
        top[("embed", "embedding")] = table("wte.weight")
        top[("decoder", "positions", "pos_embedding")] = lambda: tensor(
            "wpe.weight", (config.max_len, d)
        )
        top[("decoder", "final_norm", "scale")] = lambda: tensor("ln_f.weight", (d,))
        top[("decoder", "final_norm", "bias")] = lambda: tensor("ln_f.bias", (d,))
    else:
        blocks, prefix, convert = list(lazy.body.layers), "layers", llama._layer_params
        top[("embed", "embedding")] = table("embed_tokens.weight")
        top[("decoder", "final_norm", "scale")] = lambda: tensor("norm.weight", (d,))
    if not config.tie_output_embedding:
        top[("decoder", "logits", "kernel")] = table("lm_head.weight", transpose=True)
    if len(blocks) != config.decoder_layers:
        raise ValueError(
            f"{source.path}: the checkpoint has {len(blocks)} layers, its config.json "
            f"{config.decoder_layers}."
        )

    def layer(i: int):
        return lambda: traverse_util.flatten_dict(convert(blocks[i], config, f"{prefix}.{i}"))

    return top, [layer(i) for i in range(len(blocks))]


def _check_tree(params: Mapping, config: TransformerConfig, source: sources.Source) -> None:
    """Every parameter of the model (LoRA aside) read, with its shape."""
    model = DecoderOnlyTransformer(config)
    tokens = jnp.zeros((1, 1), jnp.int32)
    shapes = jax.eval_shape(lambda: nn.unbox(model.init(jax.random.key(0), tokens)))["params"]
    want = {k: v.shape for k, v in traverse_util.flatten_dict(shapes).items()}
    have = {k: tuple(v.shape) for k, v in params.items()}
    if want != have:
        missing = sorted("/".join(k) for k in set(want) - set(have))
        wrong = sorted("/".join(k) for k in set(want) & set(have) if want[k] != have[k])
        extra = sorted("/".join(k) for k in set(have) - set(want))
        raise ValueError(
            f"{source.path}: the weights do not fit the model of its config.json: missing "
            f"{missing}, wrong shape {wrong}, unexpected {extra}."
        )


def _without_adapters(model: TransformerConfig) -> dict:
    """Config fields that switch LoRA adapters off (none where the config has no LoRA)."""
    return {"lora_rank": 0} if getattr(model, "lora_rank", 0) else {}
