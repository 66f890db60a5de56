"""Encoder and decoder layers and stacks (seed 000: encoder/decoder, residuals, LayerNorm).

Each sublayer sits in a residual branch. Pre-norm (default, seed 000 / GPT-2):
    x = x + Dropout(Sublayer(LayerNorm(x)))
Post-norm (the 2017 paper, `norm_position='post'`):
    x = LayerNorm(x + Dropout(Sublayer(x)))
A pre-norm stack ends with one more LayerNorm; a post-norm stack needs none (config
`final_norm=True` adds it, as torch.nn.Transformer has).

For generation the decoder stack takes a KV cache in and returns it
(`decoding.cache.init_decoder_cache` builds an empty one). Its tree mirrors the parameter
tree: `{'layers_0': ..., ...}` for an unrolled stack, `{'layers': ...}` with a leading
`(num_layers,)` axis under `nn.scan`; each layer holds `{'self_attention': {'k', 'v'}}` and,
with cross-attention, `{'cross_attention': {'k', 'v'}}`.
"""

from __future__ import annotations

from collections.abc import Callable

import chex
import jax
from flax import linen as nn

from flax_transformer import axes
from flax_transformer.config import TransformerConfig
from flax_transformer.layers import FeedForward, LayerNorm, MultiHeadAttention, PositionalEncoding
from flax_transformer.layers.initializers import partitioned


def _layer_norm(config: TransformerConfig, name: str) -> LayerNorm:
    return LayerNorm(
        epsilon=config.layer_norm_eps,
        use_bias=config.use_bias,
        dtype=config.dtype,
        param_dtype=config.param_dtype,
        name=name,
    )


def _attention(config: TransformerConfig, name: str, cross: bool = False) -> MultiHeadAttention:
    return MultiHeadAttention(
        num_heads=config.num_heads,
        cross=cross,
        dropout_rate=config.attention_dropout_rate,
        use_bias=config.use_bias,
        impl=config.attention_impl,
        init_std=config.init_std,
        dtype=config.dtype,
        param_dtype=config.param_dtype,
        name=name,
    )


def _feed_forward(config: TransformerConfig) -> FeedForward:
    return FeedForward(
        d_ff=config.d_ff,
        activation=config.activation,
        use_bias=config.use_bias,
        init_std=config.init_std,
        dtype=config.dtype,
        param_dtype=config.param_dtype,
        name="ffn",
    )


class _Residual:
    """Wires one sublayer into its residual branch with the configured norm position."""

    def __init__(self, config: TransformerConfig, deterministic: bool):
        self.config, self.deterministic = config, deterministic

    def __call__(self, x, norm: LayerNorm, sublayer: Callable[[jax.Array], jax.Array]):
        drop = nn.Dropout(rate=self.config.dropout_rate, deterministic=self.deterministic)
        if self.config.norm_position == "pre":
            return x + drop(sublayer(norm(x)))
        return norm(x + drop(sublayer(x)))


class EncoderLayer(nn.Module):
    """Self-attention then feed-forward, each in a residual branch.

    Call: `(x (B, S, D), mask (S, S) or (B|1, N|1, S, S))` -> `((B, S, D), None)`; the
    `(carry, None)` return lets `nn.scan` stack it.
    """

    config: TransformerConfig
    deterministic: bool = True

    @nn.compact
    def __call__(self, x_BSD: jax.Array, mask: jax.Array | None):
        chex.assert_rank(x_BSD, 3)
        cfg = self.config
        residual = _Residual(cfg, self.deterministic)
        attn = _attention(cfg, "self_attention")
        x_BSD = residual(
            x_BSD,
            _layer_norm(cfg, "norm_attention"),
            lambda h: attn(h, mask=mask, deterministic=self.deterministic),
        )
        x_BSD = residual(x_BSD, _layer_norm(cfg, "norm_ffn"), _feed_forward(cfg))
        x_BSD = nn.with_logical_constraint(x_BSD, (axes.BATCH, axes.LENGTH, axes.EMBED))
        return x_BSD, None


class DecoderLayer(nn.Module):
    """Masked self-attention, then cross-attention over the encoder output (if any), then FFN.

    Call: `(y (B, T, D), encoded (B, S, D) or None, self_mask, cross_mask, cache_index,
    cache)` -> `((B, T, D), updated cache or None)`. With `cross_attention=False`
    (decoder-only models) `encoded` and `cross_mask` are ignored and the layer has no
    cross-attention parameters. Without a cache, `cache_index` and `cache` are None. With
    one, the self-attention mask is over cache slots `(B, 1, T, L)`, and `encoded` may be
    None once the cross-attention keys/values are cached.
    """

    config: TransformerConfig
    deterministic: bool = True
    cross_attention: bool = True

    @nn.compact
    def __call__(self, y_BTD, encoded_BSD, self_mask, cross_mask, cache_index=None, cache=None):
        chex.assert_rank(y_BTD, 3)
        cfg = self.config
        residual = _Residual(cfg, self.deterministic)
        new_cache = None if cache is None else {}

        def attend(module, name, h, x_kv, mask):
            if cache is None:
                return module(h, x_kv, mask=mask, deterministic=self.deterministic)
            out, new_cache[name] = module(
                h,
                x_kv,
                mask=mask,
                deterministic=self.deterministic,
                cache=cache[name],
                cache_index=cache_index,
            )
            return out

        self_attn = _attention(cfg, "self_attention")
        y_BTD = residual(
            y_BTD,
            _layer_norm(cfg, "norm_self_attention"),
            lambda h: attend(self_attn, "self_attention", h, None, self_mask),
        )
        if self.cross_attention:
            if encoded_BSD is None and cache is None:
                raise ValueError("DecoderLayer(cross_attention=True) needs the encoder output.")
            cross_attn = _attention(cfg, "cross_attention", cross=True)
            y_BTD = residual(
                y_BTD,
                _layer_norm(cfg, "norm_cross_attention"),
                lambda h: attend(cross_attn, "cross_attention", h, encoded_BSD, cross_mask),
            )
        y_BTD = residual(y_BTD, _layer_norm(cfg, "norm_ffn"), _feed_forward(cfg))
        y_BTD = nn.with_logical_constraint(y_BTD, (axes.BATCH, axes.LENGTH, axes.EMBED))
        return y_BTD, new_cache


def _stack(
    layer_cls: type[nn.Module],
    config: TransformerConfig,
    num_layers: int,
    num_args: int,
    *,
    cached: bool = False,
    **layer_kwargs,
) -> Callable:
    """Build the layer stack: `nn.scan` over one stacked layer, or `num_layers` unrolled ones.

    Returns a function `(x, *args, cache=None) -> (x, cache)` to call inside a compact
    module; the `num_args` args are the same for every layer. If `cached`, each layer
    also takes its part of `cache` (a tree as in the module docstring, or None) as a last
    argument and returns it updated; the function reassembles the tree. Scanned params
    live under 'layers' with a leading `(num_layers,)` axis; unrolled ones under
    'layers_0', 'layers_1', ...
    """
    if config.remat:
        layer_cls = nn.remat(layer_cls, prevent_cse=not config.scan_layers)
    if config.scan_layers:
        scanned = nn.scan(
            layer_cls,
            variable_axes={"params": 0, "intermediates": 0, "cache": 0},
            split_rngs={"params": True, "dropout": True},
            # The per-layer cache is scanned over (axis 0 = layer); the returned caches
            # are stacked back along the same axis.
            in_axes=(nn.broadcast,) * num_args + ((0,) if cached else ()),
            length=num_layers,
            metadata_params={nn.PARTITION_NAME: axes.LAYERS},
        )(config, name="layers", **layer_kwargs)

        def run_scanned(x, *args, cache=None):
            if not cached:
                return scanned(x, *args)[0], None
            x, layer_cache = scanned(x, *args, None if cache is None else cache["layers"])
            return x, None if cache is None else {"layers": layer_cache}

        return run_scanned
    layers = [layer_cls(config, name=f"layers_{i}", **layer_kwargs) for i in range(num_layers)]

    def run_unrolled(x, *args, cache=None):
        new_cache = None if cache is None else {}
        for i, layer in enumerate(layers):
            if not cached:
                x, _ = layer(x, *args)
                continue
            layer_cache = None if cache is None else cache[f"layers_{i}"]
            x, layer_cache = layer(x, *args, layer_cache)
            if cache is not None:
                new_cache[f"layers_{i}"] = layer_cache
        return x, new_cache

    return run_unrolled


class Encoder(nn.Module):
    """Embedding + positions + dropout, `encoder_layers` EncoderLayers, final norm (pre-norm).

    Attributes:
      config: the model config.
      embed: the token embedding module (shared with the decoder when configured).
    """

    config: TransformerConfig
    embed: nn.Module

    @nn.compact
    def __call__(
        self, src_BS: jax.Array, mask: jax.Array | None, *, deterministic: bool = True
    ) -> jax.Array:
        """src ids `(B, S)`, mask `(S, S)` or `(B|1, N|1, S, S)` -> encoded `(B, S, D)`."""
        cfg = self.config
        x_BSD = _embed_tokens(cfg, self.embed, src_BS, deterministic, None)
        stack = _stack(EncoderLayer, cfg, cfg.encoder_layers, 1, deterministic=deterministic)
        x_BSD, _ = stack(x_BSD, mask)
        if cfg.use_final_norm:
            x_BSD = _layer_norm(cfg, "final_norm")(x_BSD)
        return x_BSD


class Decoder(nn.Module):
    """Embedding + positions + dropout, `decoder_layers` DecoderLayers, final norm, logits.

    Attributes:
      config: the model config.
      embed: the target token embedding (its transpose gives the logits when tied).
      cross_attention: False for decoder-only language models.
    """

    config: TransformerConfig
    embed: nn.Module
    cross_attention: bool = True

    @nn.compact
    def __call__(
        self,
        tgt_BT,
        encoded_BSD,
        self_mask,
        cross_mask,
        *,
        deterministic: bool = True,
        positions_BT: jax.Array | None = None,
        cache: dict | None = None,
        cache_index: jax.Array | None = None,
    ):
        """Target ids `(B, T)` -> float32 logits `(B, T, V)`.

        With a `cache` (from `decoding.cache.init_decoder_cache`) and `cache_index` `(B,)` (each
        sequence's tokens so far), the T tokens are written at slots `cache_index + t` and
        the call returns `(logits, updated cache)`; `positions_BT` should then be those
        slots and `self_mask` a `(B, 1, T, L)` mask over slots.
        """
        cfg = self.config
        y_BTD = _embed_tokens(cfg, self.embed, tgt_BT, deterministic, positions_BT)
        stack = _stack(
            DecoderLayer,
            cfg,
            cfg.decoder_layers,
            4,
            cached=True,
            deterministic=deterministic,
            cross_attention=self.cross_attention,
        )
        y_BTD, cache = stack(y_BTD, encoded_BSD, self_mask, cross_mask, cache_index, cache=cache)
        if cfg.use_final_norm:
            y_BTD = _layer_norm(cfg, "final_norm")(y_BTD)
        if cfg.tie_output_embedding:
            logits_BTV = self.embed.attend(y_BTD)
        else:
            logits_BTV = nn.DenseGeneral(
                cfg.output_vocab_size,
                use_bias=False,
                dtype=cfg.dtype,
                param_dtype=cfg.param_dtype,
                name="logits",
                kernel_init=partitioned(
                    nn.initializers.normal(cfg.init_std), (axes.EMBED, axes.VOCAB)
                ),
            )(y_BTD)
        logits_BTV = logits_BTV.astype("float32")
        return logits_BTV if cache is None else (logits_BTV, cache)


def _embed_tokens(
    cfg: TransformerConfig,
    embed: nn.Module,
    ids_BT: jax.Array,
    deterministic: bool,
    positions_BT: jax.Array | None,
) -> jax.Array:
    """Token embedding (times sqrt(D) if configured) + positions, then dropout."""
    x_BTD = embed(ids_BT)
    if cfg.scale_embeddings:
        x_BTD = x_BTD * jax.numpy.sqrt(cfg.d_model).astype(x_BTD.dtype)
    x_BTD = _positions(cfg)(x_BTD, positions_BT)
    x_BTD = nn.Dropout(rate=cfg.dropout_rate, deterministic=deterministic)(x_BTD)
    return nn.with_logical_constraint(x_BTD, (axes.BATCH, axes.LENGTH, axes.EMBED))


def _positions(cfg: TransformerConfig) -> PositionalEncoding:
    return PositionalEncoding(
        cfg.max_len, cfg.positional, param_dtype=cfg.param_dtype, name="positions"
    )
