"""Import a GPT-2 checkpoint in Hugging Face `transformers` layout into `DecoderOnlyTransformer`.

GPT-2 is our decoder-only model with these options: learned positions, no embedding
scaling, pre-norm with a final LayerNorm (`ln_f`), GELU (tanh approximation, "gelu_new"),
biases everywhere, and the output tied to the token embedding. Its `Conv1D` weights are
already `(in, out)`, so no transposes are needed:

    wte (V, D), wpe (max_len, D)       -> embed/embedding (V + 1, D), decoder/positions
    h.i.ln_1, ln_2, ln_f               -> norm_self_attention, norm_ffn, final_norm
    h.i.attn.c_attn (D, 3D)            -> self_attention qkv_kernel (D, 3, N, H)
    h.i.attn.c_proj (D, D)             -> self_attention out_kernel (N, H, D)
    h.i.mlp.c_fc (D, F), c_proj (F, D) -> ffn wi_kernel, wo_kernel

Padding: our models mask `config.pad_id` in every attention, but GPT-2 has no pad token and
id 0 is a real token ('!'). The imported model therefore gets one extra id, `pad_id = V`,
with a zero embedding row: `vocab_size = V + 1`. Every GPT-2 id keeps its meaning and none
is masked. The logits have V + 1 entries; the last one (pad) is meaningless: ignore it,
i.e. use `logits[..., :V]`. `generate_text` never emits `pad_id`, so generations are GPT-2
tokens; it pads finished rows with `pad_id` (V), which a tokenizer does not know: cut
rows at EOS. Right-pad prompts with `config.pad_id`, not with GPT-2's EOS.

`transformers` and torch are imported inside `load_gpt2` only when given a directory.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from flax_transformer.config import TransformerConfig
from flax_transformer.interop._util import (
    check_shape,
    check_tied_head,
    dummy_tokens,
    finish_params,
    layer_norm_params,
    load_hf_model,
    stack_layers,
    to_numpy,
)
from flax_transformer.models import DecoderOnlyTransformer

# transformers' `activation_function` names -> ours ("gelu_new" is the tanh approximation
# that the original GPT-2 used; "gelu_pytorch_tanh" is the same formula in torch).
_ACTIVATIONS = {
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu": "gelu",
    "relu": "relu",
    "relu2": "relu2",  # ReLU squared
}


def gpt2_config(hf_config: Any, **overrides) -> TransformerConfig:
    """The `TransformerConfig` equivalent to a `transformers.GPT2Config`.

    `vocab_size` is GPT-2's V + 1 and `pad_id` is V (see the module docstring); dropout is
    0 (inference parity). `overrides` replace any field (e.g. `scan_layers=True`,
    `dtype='bfloat16'`, `dropout_rate=0.1` to fine-tune).
    """
    model_type = getattr(hf_config, "model_type", None)
    if model_type != "gpt2":
        raise ValueError(f"gpt2_config needs a GPT2Config, got model_type={model_type!r}.")
    unsupported = {
        "scale_attn_weights": (hf_config.scale_attn_weights, True),
        "scale_attn_by_inverse_layer_idx": (hf_config.scale_attn_by_inverse_layer_idx, False),
        "add_cross_attention": (hf_config.add_cross_attention, False),
    }
    for name, (value, needed) in unsupported.items():
        if bool(value) != needed:
            raise ValueError(f"GPT2Config.{name}={value!r} is not supported; need {needed}.")
    activation = hf_config.activation_function
    if activation not in _ACTIVATIONS:
        raise ValueError(
            f"GPT2Config.activation_function={activation!r} has no equivalent; "
            f"supported: {sorted(_ACTIVATIONS)}."
        )
    vocab = hf_config.vocab_size
    fields = dict(
        vocab_size=vocab + 1,
        pad_id=vocab,
        d_model=hf_config.n_embd,
        num_heads=hf_config.n_head,
        d_ff=hf_config.n_inner or 4 * hf_config.n_embd,
        num_layers=hf_config.n_layer,
        max_len=hf_config.n_positions,
        dropout_rate=0.0,
        attention_dropout_rate=0.0,
        norm_position="pre",
        final_norm=True,
        positional="learned",
        activation=_ACTIVATIONS[activation],
        use_bias=True,
        layer_norm_eps=hf_config.layer_norm_epsilon,
        share_embeddings=True,
        tie_output_embedding=bool(getattr(hf_config, "tie_word_embeddings", True)),
        scale_embeddings=False,
    )
    fields.update(overrides)
    return TransformerConfig(**fields)


def _linear(conv: Any, shape: tuple[int, int], name: str) -> tuple[np.ndarray, np.ndarray]:
    """A GPT-2 `Conv1D` -> `(kernel (in, out), bias (out,))`."""
    kernel = check_shape(to_numpy(conv.weight, f"{name}.weight"), shape, f"{name}.weight")
    bias = check_shape(to_numpy(conv.bias, f"{name}.bias"), shape[1:], f"{name}.bias")
    return kernel, bias


def _block_params(block: Any, config: TransformerConfig, name: str) -> dict:
    d, n, h, f = config.d_model, config.num_heads, config.head_dim, config.d_ff
    qkv, qkv_b = _linear(block.attn.c_attn, (d, 3 * d), f"{name}.attn.c_attn")
    out, out_b = _linear(block.attn.c_proj, (d, d), f"{name}.attn.c_proj")
    wi, wi_b = _linear(block.mlp.c_fc, (d, f), f"{name}.mlp.c_fc")
    wo, wo_b = _linear(block.mlp.c_proj, (f, d), f"{name}.mlp.c_proj")
    return {
        "norm_self_attention": layer_norm_params(block.ln_1, d, True, f"{name}.ln_1"),
        # c_attn's 3D outputs are [q | k | v], each D split head-major into (N, H).
        "self_attention": {
            "qkv_kernel": qkv.reshape(d, 3, n, h),
            "qkv_bias": qkv_b.reshape(3, n, h),
            "out_kernel": out.reshape(n, h, d),
            "out_bias": out_b,
        },
        "norm_ffn": layer_norm_params(block.ln_2, d, True, f"{name}.ln_2"),
        "ffn": {"wi_kernel": wi, "wi_bias": wi_b, "wo_kernel": wo, "wo_bias": wo_b},
    }


def load_gpt2(model_or_path: Any, **config_overrides) -> tuple[TransformerConfig, dict]:
    """Import GPT-2 weights into `DecoderOnlyTransformer`.

    Args:
      model_or_path: a `transformers` `GPT2LMHeadModel` or `GPT2Model`, or the path of a
        local directory saved with `save_pretrained` (loaded with `local_files_only=True`).
      **config_overrides: fields of the returned config to change (see `gpt2_config`);
        `scan_layers=True` gives the scanned parameter layout.

    Returns:
      `(config, variables)`: `DecoderOnlyTransformer(config).apply(variables, tokens)` gives
      `(B, T, V + 1)` logits whose first V entries match GPT-2's (the last is the added pad
      id, see the module docstring).
    """
    model = load_hf_model(model_or_path, "GPT2LMHeadModel", "load_gpt2")
    hf_config = getattr(model, "config", None)
    if hf_config is None:
        raise TypeError(f"load_gpt2 needs a transformers GPT-2 model, got {type(model).__name__}.")
    config = gpt2_config(hf_config, **config_overrides)
    body = getattr(model, "transformer", model)  # GPT2LMHeadModel wraps a GPT2Model
    vocab, d = hf_config.vocab_size, config.d_model
    wte = check_shape(to_numpy(body.wte.weight, "wte"), (vocab, d), "wte.weight")
    pad_row = np.zeros((1, d), np.float32)  # the added pad id: never a GPT-2 token
    decoder = stack_layers(
        [_block_params(block, config, f"h.{i}") for i, block in enumerate(body.h)], config
    )
    decoder["final_norm"] = layer_norm_params(body.ln_f, d, True, "ln_f")
    decoder["positions"] = {
        "pos_embedding": check_shape(to_numpy(body.wpe.weight), (config.max_len, d), "wpe")
    }
    check_tied_head(model, body.wte.weight, config, "load_gpt2")
    if not config.tie_output_embedding:
        head = getattr(model, "lm_head", None)
        if head is None:
            raise ValueError("tie_word_embeddings=False needs a GPT2LMHeadModel (its lm_head).")
        kernel = check_shape(to_numpy(head.weight, "lm_head"), (vocab, d), "lm_head.weight").T
        decoder["logits"] = {"kernel": np.concatenate([kernel, pad_row.T], axis=1)}
    params = {"embed": {"embedding": np.concatenate([wte, pad_row])}, "decoder": decoder}
    return config, finish_params(params, DecoderOnlyTransformer(config), config, dummy_tokens())
