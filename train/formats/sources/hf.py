"""A Hugging Face model directory as a pretrained source, as `save_pretrained` writes it:
GPT-2 and the Llama family (Llama, Mistral).

- **the model config**: `config.json`, read as JSON (no `transformers` at run time) with
  `transformers`' own defaults for the keys an older checkpoint leaves out (`HF_DEFAULTS`),
  then converted by the library's `gpt2_config` / `llama_config`, so a fine-tuned model is
  the model the library's tested importers build (vocabulary V + 1: the added pad id V),
  with the dropout rates the checkpoint was pretrained with (`checkpoint_dropout`).
- **the tokenizer files**: `tokenizer.json` and its companions (`TOKENIZER_FILES`), read by
  `train.data.hf_tokenizer`.
- **the weights**: `model.safetensors` or its shards, checked to be there, read tensor by
  tensor (`HFSource.tensor_reader`, `train.formats.sources.safetensors_reader`) and
  converted and placed by `train.program.weights`.
"""

from __future__ import annotations

import dataclasses
import logging
import pathlib
import types
from collections.abc import Mapping
from typing import Any

from flax_transformer import TransformerConfig
from flax_transformer.interop.gpt2 import gpt2_config
from flax_transformer.interop.llama import llama_config
from train.formats.sources.base import (
    CHAT_TEMPLATE_FILE,
    CONFIG_FILE,
    TOKENIZER_CONFIG_FILE,
    TOKENIZER_FILE,
    TOKENIZER_FILES,
    Kind,
    Source,
    config_json_or_none,
    copy_file,
    fail,
    read_config_json,
)
from train.formats.sources.safetensors_reader import (
    WEIGHTS_FILE,
    WEIGHTS_INDEX_FILE,
    SafetensorsReader,
)

# Names of this module's before the base module held them (imported from here elsewhere).
__all__ = [
    "CHAT_TEMPLATE_FILE",
    "CONFIG_FILE",
    "FAMILIES",
    "HF_DEFAULTS",
    "KIND",
    "TOKENIZER_CONFIG_FILE",
    "TOKENIZER_FILE",
    "TOKENIZER_FILES",
    "WEIGHTS_FILE",
    "WEIGHTS_INDEX_FILE",
    "HFSource",
    "checkpoint_dropout",
    "convert_config",
    "copy_file",
    "fail",
    "read_config_json",
    "read_hf_directory",
]

# The model types read: model_type -> the family of the library's converter and importer.
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
        "resid_pdrop": 0.1,
        "embd_pdrop": 0.1,
        "attn_pdrop": 0.1,
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
        "attention_dropout": 0.0,
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
        "attention_dropout": 0.0,
    },
}


@dataclasses.dataclass(frozen=True)
class HFSource(Source):
    """A Hugging Face model directory (or a run's snapshot of its small files).

    Attributes:
        path: the directory.
        family: 'gpt2' or 'llama' (Mistral configs are Llama-family).
        hf_config: config.json with transformers' defaults filled in.
        model: the model config the library's importer gives (vocabulary V + 1, pad id V).
    """

    path: pathlib.Path
    family: str
    hf_config: Mapping[str, Any]
    model: TransformerConfig

    def tensor_reader(self) -> SafetensorsReader:
        """`model.safetensors` or its shards, tensor by tensor."""
        return SafetensorsReader(self.path)


def _hf_namespace(hf_config: Mapping[str, Any]) -> types.SimpleNamespace:
    """config.json as the attribute object the library's converters read."""
    ns = types.SimpleNamespace(**hf_config)
    if hf_config.get("model_type") in ("llama", "mistral"):
        if ns.num_key_value_heads is None:
            ns.num_key_value_heads = ns.num_attention_heads
        if getattr(ns, "rope_parameters", None) is None and getattr(ns, "rope_scaling", None):
            ns.rope_parameters = ns.rope_scaling
    return ns


def read_hf_directory(directory: pathlib.Path, raw: Mapping[str, Any], need_weights: bool):
    """The `HFSource` of a directory whose config.json (`raw`) names a `model_type`.

    Raises:
        ValueError: an unsupported model type or option, or no safetensors weights (when
            `need_weights`); one line naming the path and the fix.
    """
    model_type = raw["model_type"]
    if model_type not in FAMILIES:
        raise fail(
            directory,
            f"model_type={model_type!r} is not supported; init_from reads GPT-2 ('gpt2') and "
            f"Llama-family ('llama', 'mistral') checkpoints",
        )
    if need_weights:
        _check_weights(directory)
    hf_config = {**HF_DEFAULTS[model_type], **raw}
    return HFSource(
        directory, FAMILIES[model_type], hf_config, convert_config(directory, model_type, hf_config)
    )


def convert_config(path: Any, model_type: str, hf_config: Mapping[str, Any]) -> TransformerConfig:
    """The model config of a config.json (`hf_config`, transformers' defaults filled in),
    from the library's converter of its family.

    Raises:
        ValueError: an option the library's model cannot express (named, with `path`).
    """
    convert = gpt2_config if FAMILIES[model_type] == "gpt2" else llama_config
    try:
        model = convert(_hf_namespace(hf_config))
        return dataclasses.replace(model, **checkpoint_dropout(model_type, hf_config))
    except (ValueError, TypeError) as err:
        raise fail(path, f"{err}".rstrip(".")) from None


# The config.json keys of each family's dropout rates: residual and embedding, attention.
DROPOUT_KEYS = {
    "gpt2": ("resid_pdrop", "attn_pdrop"),
    "llama": (None, "attention_dropout"),
    "mistral": (None, "attention_dropout"),
}


def checkpoint_dropout(model_type: str, hf_config: Mapping[str, Any]) -> dict[str, float]:
    """The dropout rates the checkpoint was pretrained with, as TransformerConfig fields: a
    run from it keeps them unless `--config.model.dropout_rate` (or `attention_dropout_rate`)
    says otherwise. GPT-2 names three (`resid_pdrop`, `embd_pdrop`, `attn_pdrop`, 0.1 by
    default); our residual and embedding dropout are one rate, `resid_pdrop` (a warning names
    an `embd_pdrop` that differs). The Llama family has no residual dropout and an
    `attention_dropout` of 0 by default.
    """
    residual, attention = DROPOUT_KEYS[model_type]
    rates = {
        "dropout_rate": float(hf_config.get(residual) or 0.0) if residual else 0.0,
        "attention_dropout_rate": float(hf_config.get(attention) or 0.0),
    }
    if model_type == "gpt2" and hf_config.get("embd_pdrop") != hf_config.get("resid_pdrop"):
        logging.warning(
            "config.json has embd_pdrop=%s and resid_pdrop=%s; the model has one rate for the "
            "embeddings and the residuals: %s (set --config.model.dropout_rate to choose).",
            hf_config.get("embd_pdrop"),
            hf_config.get("resid_pdrop"),
            rates["dropout_rate"],
        )
    return rates


def _check_weights(directory: pathlib.Path) -> None:
    if (directory / WEIGHTS_FILE).is_file() or (directory / WEIGHTS_INDEX_FILE).is_file():
        return
    if any(directory.glob("pytorch_model*.bin")):
        raise fail(
            directory,
            "holds PyTorch .bin weights only; write safetensors with "
            "model.save_pretrained(dir, safe_serialization=True)",
        )
    raise fail(directory, f"no weights ({WEIGHTS_FILE} or {WEIGHTS_INDEX_FILE})")


def is_hf_directory(path: pathlib.Path) -> bool:
    """Whether `path` is a directory whose config.json names a `model_type`."""
    raw = config_json_or_none(path)
    return isinstance(raw, dict) and "model_type" in raw


KIND = Kind(
    "Hugging Face directory",
    detect=is_hf_directory,
    read=lambda path, need_weights: read_hf_directory(path, read_config_json(path), need_weights),
)
