"""Export a `DecoderOnlyTransformer` to Hugging Face's GPT-2 layout (safetensors + config.json).

The inverse of `load_gpt2`, for a model trained here: `transformers` loads the directory with
`GPT2LMHeadModel.from_pretrained(path)` and reproduces our logits. torch and transformers are
not needed to write it; only `safetensors` (numpy flavour).

What GPT-2 can hold, and how our options map onto it:
- pre-norm LayerNorm blocks with biases everywhere and a final LayerNorm (`ln_f`); the
  activation 'gelu_tanh' ("gelu_new"), 'gelu', 'relu' or 'relu2' (transformers' "relu2",
  ReLU squared); plain multi-head attention.
- positions: a learned table is `wpe`; the sinusoidal table is written into `wpe` as it is
  (a fixed table added to the token embedding is a learned table that was never trained).
- `scale_embeddings` (tokens times sqrt(d_model)): `wte` holds the scaled embedding, and the
  output layer, which must not be scaled, becomes an untied `lm_head`
  (`tie_word_embeddings=False`).
- padding: our model never lets a query attend to a `pad_id` key; GPT-2 has no such mask. The
  two agree on every sequence without `pad_id` tokens (pass an attention mask to
  `transformers` where there is padding).

Anything else (RMSNorm, gated feed-forward, post-norm, missing biases, a logits bias,
QK-norm, logit or attention-logit soft-capping) has no GPT-2 equivalent and is refused
with the field named.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
from typing import Any

import jax
import numpy as np
from flax import linen as nn

from flax_transformer.config import TransformerConfig
from flax_transformer.functional.positions import sinusoidal_positions
from flax_transformer.models import DecoderOnlyTransformer, check_param_paths

# Our activation names -> transformers' `activation_function`.
_HF_ACTIVATIONS = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu", "relu2": "relu2"}
WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"


def _resolved(config: TransformerConfig, switch: str) -> bool:
    """A bias switch (`attention_bias`, `ffn_bias`, `norm_bias`) with None meaning use_bias."""
    value = getattr(config, switch)
    return config.use_bias if value is None else value


def check_no_lora(fn: str, config: TransformerConfig) -> None:
    """Hugging Face's GPT-2 and Llama have no LoRA adapters: refuse a config with them
    (exporting its kernels alone would drop the adapters without a word)."""
    if config.lora_rank:
        raise ValueError(
            f"{fn}: TransformerConfig.lora_rank={config.lora_rank} has LoRA adapters, which "
            "the Hugging Face layout cannot hold; fold them into the kernels first: "
            "config, params = flax_transformer.merge_lora(config, params)."
        )


def _check_gpt2_compatible(config: TransformerConfig) -> None:
    """Raise ValueError naming every field that GPT-2's layout cannot express."""
    check_no_lora("export_gpt2", config)
    wanted = {
        "norm": ("layernorm", config.norm),
        "norm_position": ("pre", config.norm_position),
        "use_final_norm": (True, config.use_final_norm),
        "attention_bias": (True, _resolved(config, "attention_bias")),
        "ffn_bias": (True, _resolved(config, "ffn_bias")),
        "norm_bias": (True, _resolved(config, "norm_bias")),
        "output_bias": (False, config.output_bias),
        "qk_norm": (False, config.qk_norm),
        "logits_soft_cap": (0.0, config.logits_soft_cap),
        "attn_logit_softcapping": (None, config.attn_logit_softcapping),
    }
    num_kv_heads = getattr(config, "num_kv_heads", None)  # grouped-query attention
    if num_kv_heads not in (None, config.num_heads):
        wanted["num_kv_heads"] = (config.num_heads, num_kv_heads)
    bad = [f"{k}={have!r} (needs {want!r})" for k, (want, have) in wanted.items() if want != have]
    if config.activation not in _HF_ACTIVATIONS:
        bad.append(f"activation={config.activation!r} (needs one of {sorted(_HF_ACTIVATIONS)})")
    if config.positional not in ("learned", "sinusoidal"):
        bad.append(f"positional={config.positional!r} (needs 'learned' or 'sinusoidal')")
    if bad:
        raise ValueError(
            "export_gpt2: GPT-2's layout cannot hold TransformerConfig " + ", ".join(bad) + "."
        )


def layer_trees(decoder: dict, num_layers: int) -> list[dict]:
    """Per-layer parameter trees, from `layers_i` or from a scanned `layers` stack."""
    if "layers" in decoder:  # nn.scan: every leaf has a leading layer axis
        return [jax.tree.map(lambda x, i=i: x[i], decoder["layers"]) for i in range(num_layers)]
    return [decoder[f"layers_{i}"] for i in range(num_layers)]


def gpt2_tensors(config: TransformerConfig, variables: Any) -> dict[str, np.ndarray]:
    """Our decoder-only parameters as GPT-2's named float32 tensors (`transformer.*`,
    `lm_head.weight` when the output layer is untied). See the module docstring.

    Args:
      config: the model's config.
      variables: `{'params': ...}` or the params tree (boxed or not) of
        `DecoderOnlyTransformer(config)`.

    Raises:
      ValueError: a config option GPT-2 cannot express, or params of another model.
    """
    _check_gpt2_compatible(config)
    params = nn.unbox(variables.get("params", variables))
    if set(params) - {"embed", "decoder"} or "decoder" not in params:
        raise ValueError(
            f"export_gpt2 needs DecoderOnlyTransformer parameters (embed, decoder), got "
            f"{sorted(params)}."
        )
    # Entries the config does not use (QK-norm scales, LoRA adapters, biases...) would be
    # left out of the file without a word.
    check_param_paths(DecoderOnlyTransformer(config), params, "export_gpt2", missing_too=True)
    arr = lambda x: np.asarray(x, dtype=np.float32)  # noqa: E731
    d, n, h = config.d_model, config.num_heads, config.head_dim
    decoder = params["decoder"]
    embedding = arr(params["embed"]["embedding"])
    scale = math.sqrt(d) if config.scale_embeddings else 1.0
    if config.positional == "learned":
        positions = arr(decoder["positions"]["pos_embedding"])
    else:
        positions = arr(sinusoidal_positions(config.max_len, d))
    out = {"transformer.wte.weight": embedding * scale, "transformer.wpe.weight": positions}
    for i, layer in enumerate(layer_trees(decoder, config.decoder_layers)):
        attn, ffn = layer["self_attention"], layer["ffn"]
        prefix = f"transformer.h.{i}"
        out |= {
            f"{prefix}.ln_1.weight": arr(layer["norm_self_attention"]["scale"]),
            f"{prefix}.ln_1.bias": arr(layer["norm_self_attention"]["bias"]),
            # (D, 3, N, H) -> (D, 3D): [q | k | v], each head-major, as load_gpt2 reads it.
            f"{prefix}.attn.c_attn.weight": arr(attn["qkv_kernel"]).reshape(d, 3 * n * h),
            f"{prefix}.attn.c_attn.bias": arr(attn["qkv_bias"]).reshape(3 * n * h),
            f"{prefix}.attn.c_proj.weight": arr(attn["out_kernel"]).reshape(n * h, d),
            f"{prefix}.attn.c_proj.bias": arr(attn["out_bias"]),
            f"{prefix}.ln_2.weight": arr(layer["norm_ffn"]["scale"]),
            f"{prefix}.ln_2.bias": arr(layer["norm_ffn"]["bias"]),
            f"{prefix}.mlp.c_fc.weight": arr(ffn["wi_kernel"]),
            f"{prefix}.mlp.c_fc.bias": arr(ffn["wi_bias"]),
            f"{prefix}.mlp.c_proj.weight": arr(ffn["wo_kernel"]),
            f"{prefix}.mlp.c_proj.bias": arr(ffn["wo_bias"]),
        }
    out["transformer.ln_f.weight"] = arr(decoder["final_norm"]["scale"])
    out["transformer.ln_f.bias"] = arr(decoder["final_norm"]["bias"])
    if not config.tie_output_embedding:
        out["lm_head.weight"] = arr(decoder["logits"]["kernel"]).T  # (D, V) -> (V, D)
    elif config.scale_embeddings:
        out["lm_head.weight"] = embedding  # the unscaled matrix: logits = x @ E^T
    return {k: np.ascontiguousarray(v) for k, v in out.items()}


def gpt2_hf_config(
    config: TransformerConfig, *, bos_token_id: int | None = None, eos_token_id: int | None = None
) -> dict[str, Any]:
    """The `config.json` of a `GPT2LMHeadModel` equivalent to `config` (dropout 0)."""
    _check_gpt2_compatible(config)
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": config.vocab_size,
        "n_positions": config.max_len,
        "n_embd": config.d_model,
        "n_layer": config.decoder_layers,
        "n_head": config.num_heads,
        "n_inner": config.d_ff,
        "activation_function": _HF_ACTIVATIONS[config.activation],
        "layer_norm_epsilon": config.layer_norm_eps,
        "tie_word_embeddings": config.tie_output_embedding and not config.scale_embeddings,
        "scale_attn_weights": True,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "bos_token_id": bos_token_id,
        "eos_token_id": eos_token_id,
        "pad_token_id": config.pad_id,
        "torch_dtype": "float32",
    }


def write_hf_directory(
    tensors: dict[str, np.ndarray], hf_config: dict[str, Any], directory: str | os.PathLike
) -> pathlib.Path:
    """Writes `model.safetensors` (torch-flavoured metadata, as `from_pretrained` expects)
    and `config.json` into `directory` (created if missing); returns it."""
    from safetensors.numpy import save_file

    path = pathlib.Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path / WEIGHTS_FILE), metadata={"format": "pt"})
    (path / CONFIG_FILE).write_text(json.dumps(hf_config, indent=2) + "\n", encoding="utf-8")
    return path


def export_gpt2(
    config: TransformerConfig,
    variables: Any,
    directory: str | os.PathLike,
    *,
    bos_token_id: int | None = None,
    eos_token_id: int | None = None,
) -> pathlib.Path:
    """Write a trained `DecoderOnlyTransformer` as a Hugging Face GPT-2 model directory.

    Args:
      config: the model's config (see the module docstring for what GPT-2 can hold).
      variables: `{'params': ...}` of `DecoderOnlyTransformer(config)` (scanned or not).
      directory: created if missing; gets `model.safetensors` and `config.json`.
      bos_token_id, eos_token_id: our tokenizer's ids, recorded for `generate`.

    Returns:
      The directory, loadable with `GPT2LMHeadModel.from_pretrained(directory)`.

    Raises:
      ValueError: the config has an option GPT-2 cannot express (named), or the params are
        not a decoder-only model's.
    """
    tensors = gpt2_tensors(config, variables)
    hf_config = gpt2_hf_config(config, bos_token_id=bos_token_id, eos_token_id=eos_token_id)
    return write_hf_directory(tensors, hf_config, directory)
