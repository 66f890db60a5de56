"""Import the weights of `torch.nn.Transformer` and causal `torch.nn.TransformerEncoder` stacks.

torch ships the layer stacks only: no embeddings, positions or output projection. The
mapping assumes the composition of the 2017 paper around them, which is what our models
compute:

    x = Embedding(ids) * sqrt(D)  +  sinusoidal_positions(T, D)     (interleaved sin/cos,
                                                                     `flax_transformer.functional`)
    logits = stack(x) @ Embedding.weight^T                           (tied output)

`nn.Transformer` (post-norm or `norm_first=True`) maps to our `Transformer`; it always ends
each stack with a LayerNorm (`encoder.norm`, `decoder.norm`), hence `final_norm=True`. A
GPT-style decoder-only model in torch is an `nn.TransformerEncoder` run with a causal mask
(`nn.TransformerDecoder` needs a memory); it maps to our `DecoderOnlyTransformer`. Other
compositions are a config away: `scale_embeddings=False`, learned positions (`positions=`),
an untied output `nn.Linear` (`output_projection=`), separate target embeddings.

Weight layouts (torch `nn.Linear` stores `(out, in)`; we store `(in, out)`):

    in_proj_weight (3D, D)          -> qkv_kernel (D, 3, N, H)   self-attention
    in_proj_weight[:D], [D:]        -> query_kernel (D, N, H), kv_kernel (D, 2, N, H)   cross
    out_proj.weight (D, D)          -> out_kernel (N, H, D)
    linear1.weight (F, D), linear2  -> ffn wi_kernel (D, F), wo_kernel (F, D)
    encoder layer norm1, norm2      -> norm_attention, norm_ffn
    decoder layer norm1, norm2, norm3 -> norm_self_attention, norm_cross_attention, norm_ffn

Our models mask `config.pad_id` (default 0) in every attention; give torch the matching
`*_key_padding_mask` (or keep the pad id out of the inputs) when comparing. `batch_first`
only changes torch's input layout, not its weights. torch is imported by the caller only:
this module works on its tensors' `detach()`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from flax_transformer.config import TransformerConfig
from flax_transformer.interop._util import (
    check_shape,
    dummy_tokens,
    finish_params,
    layer_norm_params,
    stack_layers,
    to_numpy,
)
from flax_transformer.models import DecoderOnlyTransformer, Transformer


def _activation_name(layer: Any) -> str:
    """Our activation name for a torch layer's `activation` (a function or a module)."""
    act = layer.activation
    name = getattr(act, "__name__", type(act).__name__).lower()
    if name == "relu":
        return "relu"
    if name == "gelu":
        approximate = getattr(act, "approximate", "none")  # nn.GELU module; F.gelu: exact
        return "gelu_tanh" if approximate == "tanh" else "gelu"
    raise ValueError(
        f"torch layer activation {act!r} has no equivalent; supported: relu, gelu (exact, tanh)."
    )


def config_from_torch(module: Any, *, vocab_size: int, max_len: int, **overrides):
    """A `TransformerConfig` matching an `nn.Transformer` or an `nn.TransformerEncoder`.

    Sizes, layer counts, `norm_first`, LayerNorm eps, activation, biases and the final
    norm are read from `module`; dropout is 0 (inference parity) and the embedding
    composition is the paper's (see the module docstring). `overrides` replace any field
    (e.g. `scan_layers=True`, `positional='learned'`, `dropout_rate=0.1` to fine-tune).

    Args:
      module: `torch.nn.Transformer` (-> `Transformer`) or `torch.nn.TransformerEncoder`
        (-> `DecoderOnlyTransformer`).
      vocab_size: V of the embedding that goes with it (torch's stacks do not hold one).
      max_len: longest sequence (size of the position table).
    """
    if hasattr(module, "encoder") and hasattr(module, "decoder"):
        stacks = [module.encoder, module.decoder]
        counts = {
            "num_layers": len(module.encoder.layers),
            "num_encoder_layers": len(module.encoder.layers),
            "num_decoder_layers": len(module.decoder.layers),
        }
    elif hasattr(module, "layers"):
        stacks = [module]
        counts = {"num_layers": len(module.layers)}
    else:
        raise TypeError(
            f"config_from_torch takes nn.Transformer or nn.TransformerEncoder, got "
            f"{type(module).__name__}."
        )
    layer = stacks[0].layers[0]
    has_norm = {stack.norm is not None for stack in stacks}
    if len(has_norm) != 1:
        raise ValueError("config_from_torch: encoder.norm and decoder.norm must both be set.")
    attn = layer.self_attn
    fields = dict(
        vocab_size=vocab_size,
        max_len=max_len,
        d_model=attn.embed_dim,
        num_heads=attn.num_heads,
        d_ff=layer.linear1.out_features,
        norm_position="pre" if layer.norm_first else "post",
        final_norm=has_norm.pop(),
        activation=_activation_name(layer),
        use_bias=attn.in_proj_bias is not None,
        layer_norm_eps=layer.norm1.eps,
        dropout_rate=0.0,
        attention_dropout_rate=0.0,
        positional="sinusoidal",
        scale_embeddings=True,
        share_embeddings=True,
        tie_output_embedding=True,
        **counts,
    )
    fields.update(overrides)
    return TransformerConfig(**fields)


def _bias(config: TransformerConfig, switch: str) -> bool:
    """A bias switch (`attention_bias`, `ffn_bias`, `norm_bias`); None means `use_bias`."""
    value = getattr(config, switch)
    return config.use_bias if value is None else value


def _check_dropped_bias(config: TransformerConfig, switch: str, bias: Any, name: str) -> None:
    """ValueError if the torch model has a bias the config has no place for (it would be
    dropped without a word)."""
    if bias is not None and not _bias(config, switch):
        raise ValueError(
            f"{name} is a bias, but the config has {switch}=False (use_bias="
            f"{config.use_bias}), which would drop it; import with {switch}=True."
        )


def _attention_params(attn: Any, config: TransformerConfig, cross: bool, name: str) -> dict:
    """An `nn.MultiheadAttention` -> our fused kernels (see the module docstring)."""
    d, n, h = config.d_model, config.num_heads, config.head_dim
    if not getattr(attn, "_qkv_same_embed_dim", True) or attn.num_heads != n:
        raise ValueError(
            f"{name}: needs kdim = vdim = d_model and num_heads={n}, got "
            f"num_heads={attn.num_heads}, kdim={attn.kdim}, vdim={attn.vdim}."
        )
    w_in = check_shape(to_numpy(attn.in_proj_weight), (3 * d, d), f"{name}.in_proj_weight")
    w_in = w_in.T  # (D, 3D): column j*D + n*H + h is projection j (q, k, v), head n, unit h
    tree = {}
    if cross:
        tree["query_kernel"] = w_in[:, :d].reshape(d, n, h)
        tree["kv_kernel"] = w_in[:, d:].reshape(d, 2, n, h)
    else:
        tree["qkv_kernel"] = w_in.reshape(d, 3, n, h)
    w_out = check_shape(to_numpy(attn.out_proj.weight), (d, d), f"{name}.out_proj.weight")
    tree["out_kernel"] = w_out.T.reshape(n, h, d)
    _check_dropped_bias(config, "attention_bias", attn.in_proj_bias, f"{name}.in_proj_bias")
    _check_dropped_bias(config, "attention_bias", attn.out_proj.bias, f"{name}.out_proj.bias")
    if _bias(config, "attention_bias"):
        b_in = check_shape(to_numpy(attn.in_proj_bias), (3 * d,), f"{name}.in_proj_bias")
        if cross:
            tree["query_bias"], tree["kv_bias"] = b_in[:d].reshape(n, h), b_in[d:].reshape(2, n, h)
        else:
            tree["qkv_bias"] = b_in.reshape(3, n, h)
        tree["out_bias"] = to_numpy(attn.out_proj.bias, f"{name}.out_proj.bias")
    return tree


def _ffn_params(layer: Any, config: TransformerConfig, name: str) -> dict:
    d, f = config.d_model, config.d_ff
    tree = {
        "wi_kernel": check_shape(to_numpy(layer.linear1.weight), (f, d), f"{name}.linear1").T,
        "wo_kernel": check_shape(to_numpy(layer.linear2.weight), (d, f), f"{name}.linear2").T,
    }
    _check_dropped_bias(config, "ffn_bias", layer.linear1.bias, f"{name}.linear1.bias")
    _check_dropped_bias(config, "ffn_bias", layer.linear2.bias, f"{name}.linear2.bias")
    if _bias(config, "ffn_bias"):
        tree["wi_bias"] = to_numpy(layer.linear1.bias, f"{name}.linear1.bias")
        tree["wo_bias"] = to_numpy(layer.linear2.bias, f"{name}.linear2.bias")
    return tree


def _layer_params(layer: Any, config: TransformerConfig, norms: tuple[str, ...], name: str):
    """One torch encoder/decoder layer; `norms` are our names for its norm1, norm2(, norm3)."""
    tree = {
        "self_attention": _attention_params(layer.self_attn, config, False, f"{name}.self_attn"),
        "ffn": _ffn_params(layer, config, name),
    }
    if hasattr(layer, "multihead_attn"):
        tree["cross_attention"] = _attention_params(
            layer.multihead_attn, config, True, f"{name}.multihead_attn"
        )
    for i, ours in enumerate(norms, start=1):
        torch_name = f"{name}.norm{i}"
        norm = getattr(layer, f"norm{i}")
        tree[ours] = layer_norm_params(norm, config.d_model, _bias(config, "norm_bias"), torch_name)
    return tree


def _stack_params(stack: Any, config: TransformerConfig, norms, name: str) -> dict:
    layers = [
        _layer_params(layer, config, norms, f"{name}.layers.{i}")
        for i, layer in enumerate(stack.layers)
    ]
    tree = stack_layers(layers, config)
    if (stack.norm is not None) != config.use_final_norm:
        raise ValueError(
            f"{name}.norm is {'set' if stack.norm is not None else 'None'} but the config has "
            f"final_norm={config.final_norm} (norm_position={config.norm_position!r}); set "
            f"final_norm={stack.norm is not None}."
        )
    if stack.norm is not None:
        tree["final_norm"] = layer_norm_params(
            stack.norm, config.d_model, _bias(config, "norm_bias"), f"{name}.norm"
        )
    return tree


def _table(x: Any, shape: tuple[int, int], name: str) -> np.ndarray:
    return check_shape(to_numpy(x, name), shape, name)


def _output_kernel(output_projection: Any, config: TransformerConfig) -> np.ndarray:
    if output_projection is None:
        raise ValueError("tie_output_embedding=False needs output_projection (an nn.Linear).")
    if getattr(output_projection, "bias", None) is not None:
        raise ValueError("output_projection has a bias; our output projection has none.")
    shape = (config.output_vocab_size, config.d_model)
    return _table(output_projection, shape, "output_projection.weight").T


def transformer_params_from_torch(
    transformer: Any,
    embedding: Any,
    config: TransformerConfig,
    *,
    target_embedding: Any = None,
    output_projection: Any = None,
) -> dict:
    """Variables for `Transformer(config)` from a `torch.nn.Transformer` and its embedding.

    Args:
      transformer: `torch.nn.Transformer` (post-norm or `norm_first=True`).
      embedding: the token embedding, `nn.Embedding` or a `(V, D)` tensor/array; shared by
        source and target and tied to the output unless the next two are given.
      config: e.g. `config_from_torch(transformer, ...)`; `scan_layers` picks the layout.
        Positions must be sinusoidal (torch has no position module to import).
      target_embedding: `(V_tgt, D)` target embedding when `share_embeddings=False`.
      output_projection: bias-free `nn.Linear(D, V_tgt)` when `tie_output_embedding=False`.

    Returns:
      `{'params': ...}` for `Transformer(config).apply`; raises ValueError naming the paths
      if the config does not fit the torch model.
    """
    if config.positional != "sinusoidal":
        raise ValueError("transformer_params_from_torch needs positional='sinusoidal'.")
    d = config.d_model
    params = {
        "embed": {"embedding": _table(embedding, (config.vocab_size, d), "embedding")},
        "encoder": _stack_params(
            transformer.encoder, config, ("norm_attention", "norm_ffn"), "encoder"
        ),
        "decoder": _stack_params(
            transformer.decoder,
            config,
            ("norm_self_attention", "norm_cross_attention", "norm_ffn"),
            "decoder",
        ),
    }
    if not config.share_embeddings:
        shape = (config.output_vocab_size, d)
        params["target_embed"] = {"embedding": _table(target_embedding, shape, "target_embedding")}
    if not config.tie_output_embedding:
        params["decoder"]["logits"] = {"kernel": _output_kernel(output_projection, config)}
    tokens = dummy_tokens()
    return finish_params(params, Transformer(config), config, tokens, tokens)


def decoder_only_params_from_torch_encoder(
    encoder: Any,
    embedding: Any,
    config: TransformerConfig,
    *,
    positions: Any = None,
    output_projection: Any = None,
) -> dict:
    """Variables for `DecoderOnlyTransformer(config)` from a causal `nn.TransformerEncoder`.

    The torch model this reproduces runs `encoder(x, mask=causal, is_causal=True)` on the
    embedded tokens (the usual GPT-style composition in torch); each encoder layer becomes
    one of our decoder layers without cross-attention (norm1 -> norm_self_attention, norm2
    -> norm_ffn) and `encoder.norm`, if set, the final norm (`final_norm=True`).

    Args:
      encoder: `torch.nn.TransformerEncoder` (post-norm or `norm_first=True`).
      embedding: token embedding, `nn.Embedding` or `(V, D)`; tied to the output unless
        `output_projection` is given.
      config: e.g. `config_from_torch(encoder, ...)`; `scan_layers` picks the layout.
      positions: learned position table `(max_len, D)` (tensor, `nn.Parameter` or
        `nn.Embedding`) when `config.positional == 'learned'`.
      output_projection: bias-free `nn.Linear(D, V)` when `tie_output_embedding=False`.

    Returns:
      `{'params': ...}` for `DecoderOnlyTransformer(config).apply`.
    """
    d = config.d_model
    decoder = _stack_params(encoder, config, ("norm_self_attention", "norm_ffn"), "encoder")
    if config.positional == "learned":
        if positions is None:
            raise ValueError("positional='learned' needs positions, a (max_len, D) table.")
        table = _table(positions, (config.max_len, d), "positions")
        decoder["positions"] = {"pos_embedding": table}
    if not config.tie_output_embedding:
        decoder["logits"] = {"kernel": _output_kernel(output_projection, config)}
    params = {
        "embed": {"embedding": _table(embedding, (config.vocab_size, d), "embedding")},
        "decoder": decoder,
    }
    return finish_params(params, DecoderOnlyTransformer(config), config, dummy_tokens())
