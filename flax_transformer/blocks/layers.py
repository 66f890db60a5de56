"""EncoderLayer and DecoderLayer (the paper §3.1; Happy-LLM ch. 2: residuals,
LayerNorm).

A layer reads only the fields of a `LayerConfig` (width, heads, feed-forward width, dropout,
norm position, activation, biases, init, dtypes): build one directly, or pass a
`TransformerConfig`, whose `layer_config` it takes. Inputs must be `(B, T, d_model)`;
another width raises ValueError.
"""

from __future__ import annotations

from collections.abc import Callable

import chex
import jax
from flax import linen as nn

from flax_transformer import axes
from flax_transformer.checks.arguments import check_model_width
from flax_transformer.config import LayerConfig, TransformerConfig
from flax_transformer.layers import FeedForward, LayerNorm, MultiHeadAttention, RMSNorm
from flax_transformer.layers.dropout import Dropout


def as_layer_config(config: LayerConfig | TransformerConfig) -> LayerConfig:
    """The `LayerConfig` of a layer given either config."""
    if isinstance(config, TransformerConfig):
        return config.layer_config
    if isinstance(config, LayerConfig):
        return config
    raise TypeError(
        f"a layer needs a LayerConfig or TransformerConfig, got {type(config).__name__}; "
        "build one with LayerConfig(d_model=..., num_heads=..., d_ff=...)."
    )


def bias_switch(config: LayerConfig | TransformerConfig, field: str) -> bool:
    """A component's bias switch (`attention_bias`, `ffn_bias`, `norm_bias`): its own value,
    or `use_bias` where it is None."""
    value = getattr(config, field)
    return config.use_bias if value is None else value


def make_layer_norm(config: LayerConfig | TransformerConfig, name: str) -> LayerNorm | RMSNorm:
    """The config's norm (`LayerNorm`, or `RMSNorm` for norm='rmsnorm') named `name`, with
    its eps (`layer_norm_eps` for both), bias and dtypes."""
    if config.norm == "rmsnorm":
        return RMSNorm(
            epsilon=config.layer_norm_eps,
            dtype=config.dtype,
            param_dtype=config.param_dtype,
            name=name,
        )
    return LayerNorm(
        epsilon=config.layer_norm_eps,
        use_bias=bias_switch(config, "norm_bias"),
        dtype=config.dtype,
        param_dtype=config.param_dtype,
        name=name,
    )


def _attention(config: LayerConfig, name: str, cross: bool = False) -> MultiHeadAttention:
    return MultiHeadAttention(
        num_heads=config.num_heads,
        num_kv_heads=config.num_kv_heads,
        # Rotary positions turn self-attention's queries and keys; cross-attention compares
        # positions of two different sequences and stays unrotated.
        rope=config.rope and not cross,
        rope_base=config.rope_base,
        cross=cross,
        dropout_rate=config.attention_dropout_rate,
        use_bias=bias_switch(config, "attention_bias"),
        impl=config.attention_impl,
        init_std=config.init_std,
        dtype=config.dtype,
        param_dtype=config.param_dtype,
        **_lora_fields(config),
        qk_norm=config.qk_norm,
        qk_norm_eps=config.layer_norm_eps,
        attn_logit_softcapping=config.attn_logit_softcapping,
        name=name,
    )


def _feed_forward(config: LayerConfig) -> FeedForward:
    return FeedForward(
        d_ff=config.d_ff,
        activation=config.activation,
        use_bias=bias_switch(config, "ffn_bias"),
        init_std=config.init_std,
        dtype=config.dtype,
        param_dtype=config.param_dtype,
        **_lora_fields(config),
        name="ffn",
    )


def _lora_fields(config: LayerConfig) -> dict:
    """The LoRA fields every attention and feed-forward module of a layer takes."""
    return {
        "lora_rank": config.lora_rank,
        "lora_alpha": config.lora_alpha,
        "lora_targets": config.lora_targets,
    }


class _Residual:
    """Wires one sublayer into its residual branch with the configured norm position."""

    def __init__(self, config: LayerConfig, deterministic: bool):
        self.config, self.deterministic = config, deterministic

    def __call__(self, x, norm: LayerNorm, sublayer: Callable[[jax.Array], jax.Array]):
        drop = Dropout(rate=self.config.dropout_rate, deterministic=self.deterministic)
        if self.config.norm_position == "pre":
            return x + drop(sublayer(norm(x)))
        return norm(x + drop(sublayer(x)))


class EncoderLayer(nn.Module):
    """Self-attention then feed-forward, each in a residual branch.

    Attributes:
      config: a `LayerConfig` (or a `TransformerConfig`; only its layer fields are read).
    """

    config: LayerConfig | TransformerConfig

    @nn.compact
    def __call__(
        self,
        x_BSD: jax.Array,
        mask: jax.Array | None = None,
        *,
        positions_BS: jax.Array | None = None,
        deterministic: bool = True,
    ) -> tuple[jax.Array, None]:
        """`(x (B, S, D), mask)` -> `((B, S, D), None)`.

        Args:
          x_BSD: the layer input; D must equal `config.d_model`.
          mask: bool, True = may attend: `(S, S)` or `(B|1, N|1, S, S)`; None attends
            everywhere.
          positions_BS: int `(B|1, S)` positions of `x_BSD`, read by rotary self-attention
            only (`config.rope`; default `0..S-1`), e.g. per-segment positions when packed.
          deterministic: pass by keyword, as at every level; False turns dropout on.

        Returns:
          `(output (B, S, D), None)`: the pair lets `nn.scan` stack the layer.
        """
        cfg = as_layer_config(self.config)
        check_model_width("EncoderLayer", "x", x_BSD, cfg.d_model)
        residual = _Residual(cfg, deterministic)
        attn = _attention(cfg, "self_attention")
        x_BSD = residual(
            x_BSD,
            make_layer_norm(cfg, "norm_attention"),
            lambda h: attn(h, mask=mask, deterministic=deterministic, positions_BT=positions_BS),
        )
        x_BSD = residual(x_BSD, make_layer_norm(cfg, "norm_ffn"), _feed_forward(cfg))
        x_BSD = nn.with_logical_constraint(x_BSD, (axes.BATCH, axes.LENGTH, axes.EMBED))
        return x_BSD, None


class DecoderLayer(nn.Module):
    """Masked self-attention, then cross-attention over the encoder output (if any), then FFN.

    Attributes:
      config: a `LayerConfig` (or a `TransformerConfig`; only its layer fields are read).
      cross_attention: False for decoder-only models: no cross-attention parameters, and
        `encoded_BSD` / `cross_mask` are ignored.
    """

    config: LayerConfig | TransformerConfig
    cross_attention: bool = True

    @nn.compact
    def __call__(
        self,
        y_BTD: jax.Array,
        encoded_BSD: jax.Array | None = None,
        self_mask: jax.Array | None = None,
        cross_mask: jax.Array | None = None,
        *,
        cache_index: jax.Array | None = None,
        positions_BT: jax.Array | None = None,
        cache: dict | None = None,
        deterministic: bool = True,
    ) -> tuple[jax.Array, dict | None]:
        """`(y (B, T, D), encoded (B, S, De), masks)` -> `((B, T, D), cache or None)`.

        Args:
          y_BTD: the layer input; D must equal `config.d_model`.
          encoded_BSD: the encoder output; its width De may differ from D (the key/value
            kernel is `(De, 2, N, H)`). None once a cache holds the cross keys/values.
          self_mask: bool `(T, T)` or `(B|1, N|1, T, T)`, usually causal; with a cache,
            `(B, 1, T, L)` over the L cache slots.
          cross_mask: bool `(T, S)` or `(B|1, N|1, T, S)` over the encoder positions.
          cache_index: int `(B,)`, with a cache only: each sequence's tokens so far.
          positions_BT: int `(B|1, T)` positions of `y_BTD`, read by rotary self-attention
            only (`config.rope`); default `cache_index + t` with a cache, else `0..T-1`.
          cache: this layer's KV cache (`blocks.stacks` docstring) or None.
          deterministic: pass by keyword, as at every level; False turns dropout on.

        Returns:
          `(output (B, T, D), updated cache)`; the cache is None without one.
        """
        cfg = as_layer_config(self.config)
        check_model_width("DecoderLayer", "y", y_BTD, cfg.d_model)
        residual = _Residual(cfg, deterministic)
        new_cache = None if cache is None else {}

        def attend(module, name, h, x_kv, mask):
            # Only self-attention reads positions (rotary); cross-attention takes none.
            positions = {} if module.cross else {"positions_BT": positions_BT}
            if cache is None:
                return module(h, x_kv, mask=mask, deterministic=deterministic, **positions)
            out, new_cache[name] = module(
                h,
                x_kv,
                mask=mask,
                deterministic=deterministic,
                cache=cache[name],
                cache_index=cache_index,
                **positions,
            )
            return out

        self_attn = _attention(cfg, "self_attention")
        y_BTD = residual(
            y_BTD,
            make_layer_norm(cfg, "norm_self_attention"),
            lambda h: attend(self_attn, "self_attention", h, None, self_mask),
        )
        if self.cross_attention:
            if encoded_BSD is None and cache is None:
                raise ValueError("DecoderLayer(cross_attention=True) needs the encoder output.")
            if encoded_BSD is not None:
                chex.assert_rank(encoded_BSD, 3)
            cross_attn = _attention(cfg, "cross_attention", cross=True)
            y_BTD = residual(
                y_BTD,
                make_layer_norm(cfg, "norm_cross_attention"),
                lambda h: attend(cross_attn, "cross_attention", h, encoded_BSD, cross_mask),
            )
        y_BTD = residual(y_BTD, make_layer_norm(cfg, "norm_ffn"), _feed_forward(cfg))
        y_BTD = nn.with_logical_constraint(y_BTD, (axes.BATCH, axes.LENGTH, axes.EMBED))
        return y_BTD, new_cache
