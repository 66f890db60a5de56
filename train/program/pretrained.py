"""Starting a run from pretrained weights (`--config.init_from=DIR`): a Hugging Face GPT-2
or Llama-family directory as `save_pretrained` writes it.

What comes from the directory, and how:

- **the model config**: `config.json`, read as JSON (no `transformers` at run time) with
  `transformers`' own defaults for the keys an older checkpoint leaves out
  (`HF_DEFAULTS`), then converted by the library's `gpt2_config` / `llama_config`, so a
  fine-tuned model is the model the library's tested importers build. The config's
  architecture fields (`ARCHITECTURE_FIELDS`) come from here; `--config.model.<field>` may
  leave them None or repeat them, and a different value is refused naming both.
- **the tokenizer**: `tokenizer.json` (`train.data.hf_tokenizer`), with the added pad id V.
- **the weights**: `model.safetensors` or its shards (`model.safetensors.index.json`), read
  tensor by tensor through a memory map and handed to the library's importers
  (`load_gpt2`, `load_llama`) as if they were a torch module, then placed with the run's
  sharding (`train.program.steps.create_train_state(..., pretrained=...)`).

A run copies the directory's small files (config and tokenizer, `SNAPSHOT_FILES`) into
`workdir/pretrained/`, so the run's tools (`train.sample`, `train.export`) work after the
source directory has moved.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import pathlib
import shutil
import types
from collections.abc import Iterator, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from flax_transformer import TransformerConfig
from flax_transformer.interop.gpt2 import gpt2_config
from flax_transformer.interop.llama import llama_config
from train.data.hf_tokenizer import TOKENIZER_FILES, PretrainedTokenizer
from train.run.failures import model_field_error

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX_FILE = "model.safetensors.index.json"
SNAPSHOT_DIR = "pretrained"
SOURCE_FILE = "source.json"
SNAPSHOT_FILES = (CONFIG_FILE, *TOKENIZER_FILES)

RUN = "run"  # the family of a train.main run directory as init_from
# The families init_from reads: model_type -> the library's config converter and importer.
FAMILIES = {"gpt2": "gpt2", "llama": "llama", "mistral": "llama"}

# transformers' defaults for the config.json keys an older save_pretrained may leave out
# (GPT2Config, LlamaConfig, MistralConfig of transformers 5; tests/test_finetune.py checks
# them against the installed transformers).
HF_DEFAULTS: dict[str, dict[str, Any]] = {
    "gpt2": {
        "vocab_size": 50257,
        "n_positions": 1024,
        "n_embd": 768,
        "n_layer": 12,
        "n_head": 12,
        "n_inner": None,
        "activation_function": "gelu_new",
        "layer_norm_epsilon": 1e-5,
        "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False,
        "add_cross_attention": False,
        "tie_word_embeddings": True,
        "bos_token_id": 50256,
        "eos_token_id": 50256,
    },
    "llama": {
        "vocab_size": 32000,
        "hidden_size": 4096,
        "intermediate_size": 11008,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": None,
        "hidden_act": "silu",
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "head_dim": None,
        "sliding_window": None,
        "bos_token_id": 1,
        "eos_token_id": 2,
    },
    "mistral": {
        "vocab_size": 32000,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "hidden_act": "silu",
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "head_dim": None,
        "sliding_window": 4096,
        "bos_token_id": 1,
        "eos_token_id": 2,
    },
}

# TransformerConfig fields that the pretrained weights decide: `--config.model.<field>` must
# be None or equal. The others (dtype, scan_layers, remat, dropout, attention_impl, LoRA...)
# are the run's to choose.
ARCHITECTURE_FIELDS = (
    "vocab_size",
    "pad_id",
    "d_model",
    "num_heads",
    "num_kv_heads",
    "d_ff",
    "num_layers",
    "max_len",
    "norm",
    "norm_position",
    "final_norm",
    "positional",
    "rope_base",
    "activation",
    "use_bias",
    "layer_norm_eps",
    "share_embeddings",
    "tie_output_embedding",
    "scale_embeddings",
    "num_encoder_layers",
    "num_decoder_layers",
    "attention_bias",
    "ffn_bias",
    "norm_bias",
    "output_bias",
)


@dataclasses.dataclass(frozen=True)
class Source:
    """A pretrained model directory, read without its weights.

    Attributes:
        path: the directory (the source, or a run's snapshot of its small files).
        family: 'gpt2' or 'llama' (Mistral configs are Llama-family), or 'run': a
            `train.main` run directory (its newest checkpoint and its tokenizer).
        hf_config: config.json with transformers' defaults filled in ({} for a run).
        model: the model config the library's importer gives (vocab V + 1, pad id V), or
            the run's.
        data: a run's data section (its tokenizer); None for a Hugging Face directory.
    """

    path: pathlib.Path
    family: str
    hf_config: Mapping[str, Any]
    model: TransformerConfig
    data: Any = None

    def tokenizer(self):
        """The directory's tokenizer (`tokenizer.json`) with the model's pad id, or the
        run's own tokenizer."""
        if self.family == RUN:
            from train.data.input_pipeline import make_tokenizer
            from train.run.rundir import RunDir

            return make_tokenizer(self.data.tokenizer, self.data.vocab_size, RunDir(self.path))
        return PretrainedTokenizer(
            self.path, model_vocab_size=self.model.vocab_size, pad_id=self.model.pad_id
        )


def _fail(value: Any, expected: str) -> ValueError:
    return ValueError(f"--config.init_from={str(value)!r}: {expected}.")


def _hf_namespace(hf_config: Mapping[str, Any]) -> types.SimpleNamespace:
    """config.json as the attribute object the library's converters read."""
    ns = types.SimpleNamespace(**hf_config)
    if hf_config.get("model_type") in ("llama", "mistral"):
        if ns.num_key_value_heads is None:
            ns.num_key_value_heads = ns.num_attention_heads
        if getattr(ns, "rope_parameters", None) is None and getattr(ns, "rope_scaling", None):
            ns.rope_parameters = ns.rope_scaling
    return ns


def read_source(path: str | os.PathLike, *, need_weights: bool = True) -> Source:
    """The pretrained directory's model config and family, checked.

    Args:
        path: `--config.init_from`: a Hugging Face GPT-2 / Llama / Mistral directory.
        need_weights: also check that the weights are there (a run's snapshot has none).

    Raises:
        ValueError: not a directory, no config.json, an unsupported model type or option,
            or no safetensors weights; one line naming the path and the fix.
    """
    directory = pathlib.Path(path)
    if not directory.is_dir():
        raise _fail(path, "not a directory; give a local Hugging Face model directory")
    config_path = directory / CONFIG_FILE
    if not config_path.is_file():
        raise _fail(path, f"no {CONFIG_FILE}: not a save_pretrained directory")
    try:
        raw = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise _fail(path, f"{CONFIG_FILE} is not readable JSON ({err})") from None
    if isinstance(raw, dict) and "task" in raw and "model" in raw:
        return _read_run_source(directory, need_weights)
    if not isinstance(raw, dict) or "model_type" not in raw:
        raise _fail(
            path,
            f"{CONFIG_FILE} has no model_type: neither a Hugging Face model nor a train.main run",
        )
    model_type = raw["model_type"]
    if model_type not in FAMILIES:
        raise _fail(
            path,
            f"model_type={model_type!r} is not supported; init_from reads GPT-2 ('gpt2') and "
            f"Llama-family ('llama', 'mistral') checkpoints",
        )
    if need_weights:
        _check_weights(directory)
    hf_config = {**HF_DEFAULTS[model_type], **raw}
    family = FAMILIES[model_type]
    convert = gpt2_config if family == "gpt2" else llama_config
    try:
        model = convert(_hf_namespace(hf_config))
    except (ValueError, TypeError) as err:
        raise _fail(path, f"{err}".rstrip(".")) from None
    return Source(directory, family, hf_config, model)


def _read_run_source(directory: pathlib.Path, need_weights: bool) -> Source:
    """A `train.main` run directory as init_from: its model section and tokenizer."""
    from train.config.config_lib import read_saved

    try:
        _, experiment = read_saved(directory)
    except (FileNotFoundError, ValueError) as err:
        raise _fail(directory, f"a train.main run whose config does not read ({err})") from None
    if experiment.data.task != "lm":
        raise _fail(
            directory,
            f"the run trained task={experiment.data.task!r}; init_from starts a language model "
            "(task='lm') from a language model",
        )
    if need_weights and not any((directory / "checkpoints").glob("*")):
        raise _fail(directory, "a train.main run without checkpoints: train it first")
    source = Source(directory, RUN, {}, experiment.model, experiment.data)
    model = dataclasses.replace(experiment.model, vocab_size=source.tokenizer().vocab_size)
    return dataclasses.replace(source, model=model)


def _check_weights(directory: pathlib.Path) -> None:
    if (directory / WEIGHTS_FILE).is_file() or (directory / WEIGHTS_INDEX_FILE).is_file():
        return
    if any(directory.glob("pytorch_model*.bin")):
        raise _fail(
            directory,
            "holds PyTorch .bin weights only; write safetensors with "
            "model.save_pretrained(dir, safe_serialization=True)",
        )
    raise _fail(directory, f"no weights ({WEIGHTS_FILE} or {WEIGHTS_INDEX_FILE})")


def merge_model_config(source: Source, model_fields: Mapping[str, Any]) -> TransformerConfig:
    """The run's model config: the source's architecture, with the run's own choices.

    Args:
        source: the pretrained directory.
        model_fields: `config.model` as a dict; an architecture field must be None or the
            source's value, any other field is applied.

    Raises:
        ValueError: an architecture field that contradicts the source (both values named),
            or an invalid field.
    """
    fields = dataclasses.asdict(source.model)
    for name, value in model_fields.items():
        if value is None:
            continue
        if name in ARCHITECTURE_FIELDS:
            if value != fields[name]:
                raise ValueError(
                    f"--config.model.{name}={value!r} contradicts {source.path}/{CONFIG_FILE}, "
                    f"whose model has {name}={fields[name]!r}: leave it None (as "
                    "configs/finetune_gpt2.py does) or set the directory's value."
                )
            continue
        if name not in fields:
            raise ValueError(f"--config.model.{name}: not a TransformerConfig field.")
        fields[name] = value
    try:
        return TransformerConfig(**fields)
    except ValueError as err:
        raise model_field_error(err) from err


def open_source(init_from: str, workdir: str | os.PathLike | None = None) -> Source:
    """`--config.init_from`'s directory, or the run's snapshot of it where the run has one
    (`workdir/pretrained/`: the tools of a finished run work after the source has moved,
    and a resumed run needs no weights from it)."""
    if workdir is not None:
        copy = pathlib.Path(workdir) / SNAPSHOT_DIR
        if (copy / CONFIG_FILE).is_file():
            return read_source(copy, need_weights=False)
    return read_source(init_from)


def snapshot(source: Source, target: pathlib.Path) -> None:
    """Copies the source's config and tokenizer files into `target` (a run's
    `pretrained/`), and records where they came from. A run's: its config.json, its
    SentencePiece model and its own `pretrained/` (the tokenizer of what it started from)."""
    target.mkdir(parents=True, exist_ok=True)
    names = SNAPSHOT_FILES
    if source.family == RUN:
        names = (CONFIG_FILE, f"spm_{source.data.vocab_size}.model")
        if (source.path / SNAPSHOT_DIR).is_dir():
            shutil.copytree(source.path / SNAPSHOT_DIR, target / SNAPSHOT_DIR, dirs_exist_ok=True)
    for name in names:
        if (source.path / name).is_file():
            shutil.copyfile(source.path / name, target / f"{name}.tmp")
            os.replace(target / f"{name}.tmp", target / name)
    record = {"path": str(source.path.resolve()), "family": source.family}
    (target / SOURCE_FILE).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")


# --- Weights -----------------------------------------------------------------------------


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
    """The tensors of a model directory's safetensors file(s), each read on request with
    plain file reads into a fresh numpy array (no memory map: the host keeps only the
    arrays asked for).

    The format (huggingface/safetensors): an 8-byte little-endian header length, a JSON
    header naming each tensor's dtype, shape and byte range, then the bytes.
    """

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


class _LazyModule:
    """A dotted prefix of tensor names that answers like a torch module: `.weight` and
    `.bias` read the tensor, other attributes are submodules, and a numbered list of
    submodules (`h`, `layers`) iterates. Names the checkpoint lacks raise AttributeError
    (`getattr(module, 'bias', None)` is None), so the importers' checks still apply."""

    def __init__(self, reader: SafetensorsReader, prefix: str):
        self._reader, self._prefix = reader, prefix

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        full = self._prefix + name
        if full in self._reader._where:
            return self._reader.get(full)
        if any(key.startswith(full + ".") for key in self._reader._where):
            return _LazyModule(self._reader, full + ".")
        raise AttributeError(f"{full}: not in the checkpoint")

    def __iter__(self) -> Iterator[_LazyModule]:
        indices = {
            int(key[len(self._prefix) :].split(".", 1)[0])
            for key in self._reader._where
            if key.startswith(self._prefix) and key[len(self._prefix) :].split(".", 1)[0].isdigit()
        }
        return iter(_LazyModule(self._reader, f"{self._prefix}{i}.") for i in sorted(indices))


def _lazy_model(source: Source, reader: SafetensorsReader) -> types.SimpleNamespace:
    """The checkpoint's layers as the objects the library's per-layer importers read
    (`body.h[i]` for GPT-2, `body.layers[i]` for Llama), and the tensor-name prefix of the
    body ('transformer.' / 'model.', or '' where the base model was saved alone)."""
    body = "transformer" if source.family == "gpt2" else "model"
    prefix = f"{body}." if any(k.startswith(f"{body}.") for k in reader.keys()) else ""
    return types.SimpleNamespace(body=_LazyModule(reader, prefix), body_prefix=prefix)


def load_weights(
    source: Source, model: TransformerConfig, placement: Mapping | None = None
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
    if source.family == RUN:
        return _load_run_weights(source, base, placement), 0
    reader = SafetensorsReader(source.path)
    lazy = _lazy_model(source, reader)

    def place(path: tuple[str, ...], array: np.ndarray):
        array = np.asarray(array).astype(dtype, copy=False)
        if placement is not None and path in placement:
            return jax.device_put(array, placement[path].sharding)
        return jnp.asarray(array)

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


def _load_run_weights(source: Source, model: TransformerConfig, placement) -> dict:
    """The newest parameters of a train.main run (LoRA adapters merged into their
    weights), in `model`'s dtype and layout, placed as `placement` says."""
    from train.tools.trained import load_trained

    trained = load_trained(source.path)
    config, params = trained.model.config, trained.params
    if getattr(config, "lora_rank", 0):
        from flax_transformer import merge_lora

        config, params = merge_lora(config, params)
    if config.scan_layers != model.scan_layers:
        raise _fail(
            source.path,
            f"the run's layers are stored with scan_layers={config.scan_layers}; set "
            f"--config.model.scan_layers={config.scan_layers}",
        )
    dtype = np.dtype(model.param_dtype)
    out = {}
    for path, value in traverse_util.flatten_dict(params).items():
        value = jnp.asarray(value, dtype)
        if placement is not None and path in placement:
            value = jax.device_put(value, placement[path].sharding)
        out[path] = value
    return traverse_util.unflatten_dict(out)


def _read_checkpoint(source: Source, lazy, reader: SafetensorsReader, config: TransformerConfig):
    """The checkpoint's parameters outside the layers (path -> a callable giving the host
    array in the parameters' dtype) and one callable per layer giving that layer's
    (path within the layer -> host array)."""
    from flax_transformer.interop import gpt2, llama

    d, dtype = config.d_model, np.dtype(config.param_dtype)
    vocab = int(source.hf_config["vocab_size"])
    body_prefix = lazy.body_prefix

    def tensor(name: str, shape: tuple[int, ...]) -> np.ndarray:
        full = body_prefix + name if not name.startswith("lm_head") else name
        if full not in reader._where:
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


def _check_tree(params: Mapping, config: TransformerConfig, source: Source) -> None:
    """Every parameter of the model (LoRA aside) read, with its shape."""
    from flax import linen as nn

    from flax_transformer import DecoderOnlyTransformer

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
