"""Hugging Face Llama-family decoders in and out of `DecoderOnlyTransformer`.

A Llama decoder is our decoder-only model with these options: RMSNorm before each sublayer
and at the end (`norm='rmsnorm'`, `norm_position='pre'`), rotary positions
(`positional='rope'`, `rope_base=rope_theta`, Llama's rotate-half layout, so no permutation
of the q/k kernels), a SwiGLU feed-forward (`activation='swiglu'`), grouped-query attention
(`num_kv_heads=num_key_value_heads`), no biases, unscaled embeddings, and an output layer
tied or not (`tie_word_embeddings`). `torch.nn.Linear` weights are `(out, in)`:

    embed_tokens (V, D)                   -> embed/embedding
    layers.i.input_layernorm (D,)         -> norm_self_attention/scale
    layers.i.self_attn.q_proj (N*H, D)    -> self_attention query_kernel (D, N, H)
                      k_proj, v_proj      -> kv_kernel (D, 2, K, H)  (K < N)
                      q, k, v when K = N  -> qkv_kernel (D, 3, N, H)
                      o_proj (D, N*H)     -> out_kernel (N, H, D)
    layers.i.post_attention_layernorm     -> norm_ffn/scale
    layers.i.mlp.gate_proj, up_proj (F, D)-> ffn wg_kernel, wi_kernel (D, F)
                 down_proj (D, F)         -> ffn wo_kernel (F, D)
    norm (D,), lm_head (V, D)             -> final_norm/scale, logits/kernel (D, V)

Mistral has the same layout (accepted when its sliding window covers max_len, i.e. is full
attention); Qwen2 adds q/k/v biases but none on o_proj, which our single `attention_bias`
switch cannot express, so it is refused. Scaled RoPE (a `rope_type` other than 'default',
e.g. Llama 3.1's long context) is refused too.

Padding: our models never attend to `pad_id` keys, but every Llama id is a real token (a
`pad_token_id`, where a checkpoint sets one, is often EOS or `<unk>`, which do occur in
input). As for GPT-2, the imported model gets one extra id, `pad_id = V`, with a zero
embedding row (and a zero output column): `vocab_size = V + 1`, no Llama token is masked,
and the last logit is meaningless: use `logits[..., :V]`. Right-pad prompts with
`config.pad_id`. `export_llama` writes a model's vocabulary as it is, pad id included, and
records that id in `config.json` (`EXPORTED_PAD_KEY`, beside `pad_token_id`); `load_llama`
of such a directory keeps it: the same V and `pad_id`, no added id, so a round trip gives
back the model it started from.

`transformers` and torch are imported only to load from a directory; export writes
safetensors from numpy arrays.
"""

from __future__ import annotations

import os
import pathlib
from typing import Any

import numpy as np
from flax import linen as nn

from flax_transformer.config import TransformerConfig
from flax_transformer.interop._util import (
    check_shape,
    check_tied_head,
    dummy_tokens,
    finish_params,
    load_hf_model,
    stack_layers,
    to_numpy,
)
from flax_transformer.interop.export import check_no_lora, layer_trees, write_hf_directory
from flax_transformer.models import DecoderOnlyTransformer, check_param_paths

_MODEL_TYPES = ("llama", "mistral")
_ACTIVATIONS = {"silu": "swiglu", "gelu": "geglu"}
_HF_ACTIVATIONS = {ours: theirs for theirs, ours in _ACTIVATIONS.items()}
# The config.json key where `export_llama` records our pad id. `pad_token_id` alone cannot say
# it: other checkpoints set that to EOS or <unk>, real tokens that must not be masked.
EXPORTED_PAD_KEY = "flax_transformer_pad_id"


def _exported_pad_id(hf_config: Any) -> int | None:
    """Our pad id where `export_llama` wrote the checkpoint (an id in [0, V)), else None."""
    pad = getattr(hf_config, EXPORTED_PAD_KEY, None)
    if isinstance(pad, int) and not isinstance(pad, bool) and 0 <= pad < hf_config.vocab_size:
        return pad
    return None


def llama_config(hf_config: Any, **overrides) -> TransformerConfig:
    """The `TransformerConfig` equivalent to a `transformers.LlamaConfig` (or Mistral's).

    `vocab_size` is Llama's V + 1 and `pad_id` is V (see the module docstring), except
    for a checkpoint `export_llama` wrote: V and the pad id it recorded; dropout is 0.
    `overrides` replace any field (`scan_layers=True`, `dtype='bfloat16'`, `pad_id=...`).

    Raises:
      ValueError: an option our model has no equivalent for (named).
    """
    model_type = getattr(hf_config, "model_type", None)
    if model_type not in _MODEL_TYPES:
        raise ValueError(
            f"llama_config needs a Llama or Mistral config, got model_type={model_type!r}."
        )
    problems = []
    # transformers >= 5 keeps rope_theta in `rope_parameters` (alias `rope_scaling`), older
    # versions as `rope_theta` with `rope_scaling` None for plain RoPE.
    rope = getattr(hf_config, "rope_parameters", None) or getattr(hf_config, "rope_scaling", None)
    rope = dict(rope or {})
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        problems.append(f"rope type {rope_type!r} ({rope}; only plain RoPE)")
    rope_theta = rope.get("rope_theta") or getattr(hf_config, "rope_theta", None) or 10000.0
    if getattr(hf_config, "attention_bias", False) or getattr(hf_config, "mlp_bias", False):
        problems.append("attention_bias/mlp_bias=True (Llama's default is False)")
    if hf_config.hidden_act not in _ACTIVATIONS:
        problems.append(
            f"hidden_act={hf_config.hidden_act!r} (needs one of {sorted(_ACTIVATIONS)})"
        )
    head_dim = getattr(hf_config, "head_dim", None)
    if head_dim not in (None, hf_config.hidden_size // hf_config.num_attention_heads):
        problems.append(f"head_dim={head_dim} (needs hidden_size / num_attention_heads)")
    window = getattr(hf_config, "sliding_window", None)
    if window is not None and window < hf_config.max_position_embeddings:
        problems.append(
            f"sliding_window={window} < max_position_embeddings (we attend to all positions)"
        )
    if problems:
        raise ValueError(f"{model_type} checkpoint not supported: " + "; ".join(problems) + ".")
    exported_pad = _exported_pad_id(hf_config)
    fields = dict(
        vocab_size=hf_config.vocab_size + (exported_pad is None),
        pad_id=hf_config.vocab_size if exported_pad is None else exported_pad,
        d_model=hf_config.hidden_size,
        num_heads=hf_config.num_attention_heads,
        num_kv_heads=hf_config.num_key_value_heads,
        d_ff=hf_config.intermediate_size,
        num_layers=hf_config.num_hidden_layers,
        max_len=hf_config.max_position_embeddings,
        dropout_rate=0.0,
        attention_dropout_rate=0.0,
        norm="rmsnorm",
        norm_position="pre",
        final_norm=True,
        positional="rope",
        rope_base=float(rope_theta),
        activation=_ACTIVATIONS[hf_config.hidden_act],
        use_bias=False,
        layer_norm_eps=hf_config.rms_norm_eps,
        share_embeddings=True,
        tie_output_embedding=bool(getattr(hf_config, "tie_word_embeddings", False)),
        scale_embeddings=False,
    )
    fields.update(overrides)
    return TransformerConfig(**fields)


def _linear_t(linear: Any, shape: tuple[int, int], name: str) -> np.ndarray:
    """A bias-free `nn.Linear` `(out, in)` -> our kernel `(in, out)`."""
    if getattr(linear, "bias", None) is not None:
        raise ValueError(f"{name} has a bias; Llama layers have none.")
    return check_shape(to_numpy(linear.weight, f"{name}.weight"), shape, f"{name}.weight").T


def _layer_params(layer: Any, config: TransformerConfig, name: str) -> dict:
    d, n, k, h, f = (
        config.d_model,
        config.num_heads,
        config.kv_heads,
        config.head_dim,
        config.d_ff,
    )
    attn, mlp = layer.self_attn, layer.mlp
    q = _linear_t(attn.q_proj, (n * h, d), f"{name}.self_attn.q_proj").reshape(d, n, h)
    k_ = _linear_t(attn.k_proj, (k * h, d), f"{name}.self_attn.k_proj").reshape(d, k, h)
    v = _linear_t(attn.v_proj, (k * h, d), f"{name}.self_attn.v_proj").reshape(d, k, h)
    out = _linear_t(attn.o_proj, (d, n * h), f"{name}.self_attn.o_proj").reshape(n, h, d)
    if k == n:
        attention = {"qkv_kernel": np.stack([q, k_, v], axis=1), "out_kernel": out}
    else:
        attention = {"query_kernel": q, "kv_kernel": np.stack([k_, v], axis=1), "out_kernel": out}

    def norm(module: Any, what: str) -> dict:
        return {"scale": check_shape(to_numpy(module.weight, what), (d,), what)}

    return {
        "norm_self_attention": norm(layer.input_layernorm, f"{name}.input_layernorm"),
        "self_attention": attention,
        "norm_ffn": norm(layer.post_attention_layernorm, f"{name}.post_attention_layernorm"),
        "ffn": {
            "wg_kernel": _linear_t(mlp.gate_proj, (f, d), f"{name}.mlp.gate_proj"),
            "wi_kernel": _linear_t(mlp.up_proj, (f, d), f"{name}.mlp.up_proj"),
            "wo_kernel": _linear_t(mlp.down_proj, (d, f), f"{name}.mlp.down_proj"),
        },
    }


def load_llama(model_or_path: Any, **config_overrides) -> tuple[TransformerConfig, dict]:
    """Import a Hugging Face Llama-family causal LM into `DecoderOnlyTransformer`.

    Args:
      model_or_path: a `LlamaForCausalLM`/`MistralForCausalLM` (or its base `LlamaModel`),
        or the path of a local `save_pretrained` directory (loaded with
        `local_files_only=True`; nothing is downloaded).
      **config_overrides: fields of the returned config to change (see `llama_config`).

    Returns:
      `(config, variables)`: `DecoderOnlyTransformer(config).apply(variables, tokens)` gives
      the checkpoint's logits, `(B, T, V + 1)` with an added pad id (the module
      docstring), `(B, T, V)` for a directory `export_llama` wrote.

    Raises:
      ValueError: an unsupported option (named) or a weight of the wrong shape.
    """
    model = load_hf_model(model_or_path, "AutoModelForCausalLM", "load_llama")
    hf_config = getattr(model, "config", None)
    if hf_config is None:
        raise TypeError(f"load_llama needs a transformers model, got {type(model).__name__}.")
    config = llama_config(hf_config, **config_overrides)
    body = getattr(model, "model", model)  # *ForCausalLM wraps the base model
    d, vocab = config.d_model, hf_config.vocab_size  # Llama's V
    # Id V, a zero row and column, is the pad id added unless the checkpoint records ours.
    added = np.zeros((d, 0 if _exported_pad_id(hf_config) is not None else 1), np.float32)
    decoder = stack_layers(
        [_layer_params(layer, config, f"layers.{i}") for i, layer in enumerate(body.layers)],
        config,
    )
    decoder["final_norm"] = {"scale": check_shape(to_numpy(body.norm.weight), (d,), "norm")}
    check_tied_head(model, body.embed_tokens.weight, config, "load_llama")
    if not config.tie_output_embedding:
        head = getattr(model, "lm_head", None)
        if head is None:
            raise ValueError("tie_word_embeddings=False needs the *ForCausalLM (its lm_head).")
        kernel = _linear_t(head, (vocab, d), "lm_head")
        decoder["logits"] = {"kernel": np.concatenate([kernel, added], 1)}
    embedding = check_shape(to_numpy(body.embed_tokens.weight), (vocab, d), "embed_tokens")
    embedding = np.concatenate([embedding, added.T])
    params = {"embed": {"embedding": embedding}, "decoder": decoder}
    return config, finish_params(params, DecoderOnlyTransformer(config), config, dummy_tokens())


def _check_llama_compatible(config: TransformerConfig, caller: str = "export_llama") -> None:
    """Raise ValueError naming every field that Llama's layout cannot express."""
    check_no_lora(caller, config)
    wanted = {
        "norm": ("rmsnorm", config.norm),
        "norm_position": ("pre", config.norm_position),
        "use_final_norm": (True, config.use_final_norm),
        "positional": ("rope", config.positional),
        "scale_embeddings": (False, config.scale_embeddings),
        "output_bias": (False, config.output_bias),
        "qk_norm": (False, config.qk_norm),
        "logits_soft_cap": (0.0, config.logits_soft_cap),
        "attn_logit_softcapping": (None, config.attn_logit_softcapping),
    }
    bad = [f"{k}={have!r} (needs {want!r})" for k, (want, have) in wanted.items() if want != have]
    if config.activation not in _HF_ACTIVATIONS:
        bad.append(f"activation={config.activation!r} (needs one of {sorted(_HF_ACTIVATIONS)})")
    for switch in ("attention_bias", "ffn_bias"):
        value = getattr(config, switch)
        if config.use_bias if value is None else value:
            bad.append(f"{switch} (or use_bias)=True (needs False)")
    if bad:
        raise ValueError(
            f"{caller}: Llama's layout cannot hold TransformerConfig " + ", ".join(bad) + "."
        )


def llama_tensors(
    config: TransformerConfig, variables: Any, *, caller: str = "export_llama"
) -> dict[str, np.ndarray]:
    """Our decoder-only parameters as `LlamaForCausalLM`'s named float32 tensors.

    Raises:
      ValueError: an option Llama's layout cannot hold, or parameters of another model;
        the message starts with `caller` (the public function the user called).
    """
    _check_llama_compatible(config, caller)
    params = nn.unbox(variables.get("params", variables))
    if set(params) - {"embed", "decoder"} or "decoder" not in params:
        raise ValueError(
            f"{caller} needs DecoderOnlyTransformer parameters (embed, decoder), got "
            f"{sorted(params)}."
        )
    # Entries the config does not use (biases, QK-norm scales...) would be left out.
    check_param_paths(DecoderOnlyTransformer(config), params, caller, missing_too=True)
    arr = lambda x: np.asarray(x, dtype=np.float32)  # noqa: E731
    d, n, k, h = config.d_model, config.num_heads, config.kv_heads, config.head_dim
    decoder = params["decoder"]
    out = {"model.embed_tokens.weight": arr(params["embed"]["embedding"])}
    for i, layer in enumerate(layer_trees(decoder, config.decoder_layers)):
        attn, ffn = layer["self_attention"], layer["ffn"]
        if "qkv_kernel" in attn:
            qkv = arr(attn["qkv_kernel"])  # (D, 3, N, H)
            q, k_, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]
        else:
            q, kv = arr(attn["query_kernel"]), arr(attn["kv_kernel"])  # (D,N,H), (D,2,K,H)
            k_, v = kv[:, 0], kv[:, 1]
        prefix = f"model.layers.{i}"
        out |= {
            f"{prefix}.input_layernorm.weight": arr(layer["norm_self_attention"]["scale"]),
            f"{prefix}.self_attn.q_proj.weight": q.reshape(d, n * h).T,
            f"{prefix}.self_attn.k_proj.weight": k_.reshape(d, k * h).T,
            f"{prefix}.self_attn.v_proj.weight": v.reshape(d, k * h).T,
            f"{prefix}.self_attn.o_proj.weight": arr(attn["out_kernel"]).reshape(n * h, d).T,
            f"{prefix}.post_attention_layernorm.weight": arr(layer["norm_ffn"]["scale"]),
            f"{prefix}.mlp.gate_proj.weight": arr(ffn["wg_kernel"]).T,
            f"{prefix}.mlp.up_proj.weight": arr(ffn["wi_kernel"]).T,
            f"{prefix}.mlp.down_proj.weight": arr(ffn["wo_kernel"]).T,
        }
    out["model.norm.weight"] = arr(decoder["final_norm"]["scale"])
    if not config.tie_output_embedding:
        out["lm_head.weight"] = arr(decoder["logits"]["kernel"]).T
    return {name: np.ascontiguousarray(x) for name, x in out.items()}


def llama_hf_config(
    config: TransformerConfig, *, bos_token_id: int | None = None, eos_token_id: int | None = None
) -> dict[str, Any]:
    """The `config.json` of a `LlamaForCausalLM` equivalent to `config`."""
    _check_llama_compatible(config)
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": config.vocab_size,
        "hidden_size": config.d_model,
        "intermediate_size": config.d_ff,
        "num_hidden_layers": config.decoder_layers,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.kv_heads,
        "head_dim": config.head_dim,
        "hidden_act": _HF_ACTIVATIONS[config.activation],
        "max_position_embeddings": config.max_len,
        "rms_norm_eps": config.layer_norm_eps,
        "rope_theta": config.rope_base,  # read by transformers < 5
        "rope_parameters": {"rope_type": "default", "rope_theta": config.rope_base},
        "tie_word_embeddings": config.tie_output_embedding,
        "attention_bias": False,
        "mlp_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": bos_token_id,
        "eos_token_id": eos_token_id,
        "pad_token_id": config.pad_id,
        EXPORTED_PAD_KEY: config.pad_id,
        "torch_dtype": "float32",
    }


def export_llama(
    config: TransformerConfig,
    variables: Any,
    directory: str | os.PathLike,
    *,
    bos_token_id: int | None = None,
    eos_token_id: int | None = None,
) -> pathlib.Path:
    """Write a `DecoderOnlyTransformer` as a Hugging Face `LlamaForCausalLM` directory.

    Args:
      config: RMSNorm, rope, SwiGLU (or GeGLU), pre-norm, no biases, unscaled embeddings
        (e.g. `configs/lm_kjv_llama.py`); grouped-query attention as it is.
      variables: `{'params': ...}` of `DecoderOnlyTransformer(config)` (scanned or not).
      directory: created if missing; gets `model.safetensors` and `config.json`.
      bos_token_id, eos_token_id: our tokenizer's ids, recorded for `generate`.

    Returns:
      The directory, loadable with `LlamaForCausalLM.from_pretrained(directory)`.

    Raises:
      ValueError: an option Llama's layout cannot hold (named), before anything is written.
    """
    tensors = llama_tensors(config, variables)
    hf_config = llama_hf_config(config, bos_token_id=bos_token_id, eos_token_id=eos_token_id)
    return write_hf_directory(tensors, hf_config, directory)
