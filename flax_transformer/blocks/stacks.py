"""Encoder and Decoder: inputs, positions and dropout, a stack of layers, a final norm.

Both take token ids with an `embed` module, or, built with `embed=None`, real-valued
embeddings `(B, T, d_model)` (image patches, audio frames, another model's states). There
is no pad id then, so padding is whatever the masks say: for a `(B, S)` bool `valid_BS`,
`valid_BS[:, None, None, :]` is the `(B, 1, 1, S)` key mask, and
`combine_masks(valid_BT[:, None, None, :], causal_mask(T))` a decoder's self-attention mask.

For generation the decoder stack takes a KV cache in and returns it
(`cache.init_decoder_cache` builds an empty one). Its tree mirrors the parameter
tree: `{'layers_0': ..., ...}` for an unrolled stack, `{'layers': ...}` with a leading
`(num_layers,)` axis under `nn.scan`; each layer holds `{'self_attention': {'k', 'v'}}` and,
with cross-attention, `{'cross_attention': {'k', 'v'}}`.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import linen as nn

from flax_transformer import axes
from flax_transformer.blocks.layers import DecoderLayer, EncoderLayer, make_layer_norm
from flax_transformer.checks.arguments import check_model_width
from flax_transformer.config import TransformerConfig
from flax_transformer.functional import soft_cap
from flax_transformer.functional.precision import mixed_dot_general
from flax_transformer.layers import PositionalEncoding
from flax_transformer.layers.dropout import Dropout
from flax_transformer.layers.initializers import partitioned


def _one_input_layer(layer_cls: type[nn.Module], cached: bool) -> type[nn.Module]:
    """`layer_cls` called as `(x, args, cache, deterministic)`: every per-layer input in one
    dict `args` of the layer's keyword names, so the stack's call has the same four positions
    whatever the layer takes (the layers themselves take their options by keyword only).

    A subclass, not a wrapper module: the parameters keep the layer's own names and paths.
    """

    class OneInputLayer(layer_cls):
        def __call__(self, x, args, cache, deterministic):
            if cached:
                return super().__call__(x, **args, cache=cache, deterministic=deterministic)
            return super().__call__(x, **args, deterministic=deterministic)

    OneInputLayer.__name__ = OneInputLayer.__qualname__ = layer_cls.__name__
    return OneInputLayer


# Positions in `OneInputLayer.__call__`, counting self: (self, x, args, cache, deterministic).
_DETERMINISTIC_ARGNUM = 4


def _stack(
    layer_cls: type[nn.Module],
    config: TransformerConfig,
    num_layers: int,
    *,
    cached: bool = False,
    **layer_kwargs,
) -> Callable:
    """Build the layer stack: `nn.scan` over one stacked layer, or `num_layers` unrolled ones.

    Returns a function `(x, args, cache=None, deterministic=True) -> (x, cache)` to call
    inside a compact module; `args` is the dict of per-layer inputs after `x`, by the
    layer's keyword names, the same for every layer (`_one_input_layer`). If `cached`, each
    layer also takes its part of `cache` (a tree as in the module docstring, or None) and
    returns it updated; the function reassembles the tree. Scanned params live under
    'layers' with a leading `(num_layers,)` axis; unrolled ones under 'layers_0', ...

    The layers get `deterministic` positionally: `nn.scan` drops keyword arguments without
    a word (dropout would silently stay off), and `nn.remat` must see it as static (a
    Python bool, read in Python control flow).
    """
    layer_config = config.layer_config
    layer_cls = _one_input_layer(layer_cls, cached)
    if config.remat:
        layer_cls = nn.remat(
            layer_cls,
            prevent_cse=not config.scan_layers,
            static_argnums=(_DETERMINISTIC_ARGNUM,),
        )
    if config.scan_layers:
        scanned = nn.scan(
            layer_cls,
            variable_axes={"params": 0, "intermediates": 0, "cache": 0},
            split_rngs={"params": True, "dropout": True},
            # The per-layer inputs and `deterministic` are broadcast to every layer; the
            # per-layer cache is scanned over (axis 0 = layer) and stacked back.
            in_axes=(nn.broadcast, 0 if cached else nn.broadcast, nn.broadcast),
            length=num_layers,
            metadata_params={nn.PARTITION_NAME: axes.LAYERS},
        )(layer_config, name="layers", **layer_kwargs)

        def run_scanned(x, args, cache=None, deterministic=True):
            layer_cache = None if cache is None else cache["layers"]
            x, layer_cache = scanned(x, args, layer_cache, deterministic)
            return x, None if cache is None else {"layers": layer_cache}

        return run_scanned
    layers = [
        layer_cls(layer_config, name=f"layers_{i}", **layer_kwargs) for i in range(num_layers)
    ]

    def run_unrolled(x, args, cache=None, deterministic=True):
        new_cache = None if cache is None else {}
        for i, layer in enumerate(layers):
            layer_cache = None if cache is None else cache[f"layers_{i}"]
            x, layer_cache = layer(x, args, layer_cache, deterministic)
            if cache is not None:
                new_cache[f"layers_{i}"] = layer_cache
        return x, new_cache

    return run_unrolled


class Encoder(nn.Module):
    """Inputs + positions + dropout, `encoder_layers` EncoderLayers, final norm (pre-norm).

    Attributes:
      config: the model config.
      embed: the token embedding module (shared with the decoder when configured), or None
        to take embeddings `(B, S, d_model)` directly (no sqrt(d_model) scaling then).
    """

    config: TransformerConfig
    embed: nn.Module | None = None

    @nn.compact
    def __call__(
        self,
        inputs: jax.Array,
        mask: jax.Array | None,
        *,
        deterministic: bool = True,
        positions_BS: jax.Array | None = None,
    ) -> jax.Array:
        """Encode source tokens or embeddings.

        Args:
          inputs: int ids `(B, S)` with an `embed` module; float embeddings `(B, S, D)`,
            D = `config.d_model`, without one.
          mask: bool, True = may attend: `(S, S)` or `(B|1, N|1, S, S)`; None attends
            everywhere (see the module docstring for masks over embeddings).
          deterministic: False turns dropout on ('dropout' rng stream).
          positions_BS: int `(B|1, S)` positions of the inputs (default 0..S-1; packed
            sequences restart at 0 in each segment); they index the position table, or with
            `positional='rope'` the self-attention rotations.

        Returns:
          encoded `(B, S, D)`.
        """
        cfg = self.config
        x_BSD = _embed_inputs("Encoder", cfg, self.embed, inputs, deterministic, positions_BS)
        stack = _stack(EncoderLayer, cfg, cfg.encoder_layers)
        x_BSD, _ = stack(
            x_BSD, {"mask": mask, "positions_BS": positions_BS}, deterministic=deterministic
        )
        if cfg.use_final_norm:
            x_BSD = make_layer_norm(cfg, "final_norm")(x_BSD)
        return x_BSD


class Decoder(nn.Module):
    """Inputs + positions + dropout, `decoder_layers` DecoderLayers, final norm, logits.

    Attributes:
      config: the model config.
      embed: the target token embedding (its transpose gives the logits when tied), or None
        to take embeddings `(B, T, d_model)` directly and return the final hidden states
        `(B, T, D)` instead of logits (add your own head).
      cross_attention: False for decoder-only models.
    """

    config: TransformerConfig
    embed: nn.Module | None = None
    cross_attention: bool = True

    @nn.compact
    def __call__(
        self,
        inputs: jax.Array,
        encoded_BSD: jax.Array | None,
        self_mask: jax.Array | None,
        cross_mask: jax.Array | None,
        *,
        deterministic: bool = True,
        positions_BT: jax.Array | None = None,
        cache: dict | None = None,
        cache_index: jax.Array | None = None,
        head: bool = True,
    ):
        """Decode target tokens or embeddings.

        Args:
          inputs: int ids `(B, T)` with an `embed` module; float embeddings `(B, T, D)`,
            D = `config.d_model`, without one.
          encoded_BSD: the encoder output; None for decoder-only models, or once the cache
            holds the cross-attention keys/values.
          self_mask: bool `(T, T)` or `(B|1, N|1, T, T)`, usually causal (nothing makes it
            so but the mask); with a cache, `(B, 1, T, L)` over the cache slots.
          cross_mask: bool `(T, S)` or `(B|1, N|1, T, S)`, or None.
          deterministic: False turns dropout on ('dropout' rng stream).
          positions_BT: positions of the inputs (default 0..T-1); with a cache, their slots.
            With `positional='rope'` the self-attention layers rotate by them.
          cache: from `cache.init_decoder_cache`; the T inputs are written at slots
            `cache_index + t`.
          cache_index: int `(B,)`, with a cache: each sequence's tokens so far.
          head: False returns the final hidden states `(B, T, D)` (after the final norm)
            without applying the head, for a loss that applies it block by block
            (`functional.blocked_cross_entropy`); its parameters are left unread.

        Returns:
          float32 logits `(B, T, V)` (soft-capped with `config.logits_soft_cap` > 0), or
          hidden states `(B, T, D)` in `config.dtype` when `embed` is None or `head` False;
          with a `cache`, the pair `(that, updated cache)`.
        """
        cfg = self.config
        y_BTD = _embed_inputs("Decoder", cfg, self.embed, inputs, deterministic, positions_BT)
        stack = _stack(
            DecoderLayer, cfg, cfg.decoder_layers, cached=True, cross_attention=self.cross_attention
        )
        # The per-layer inputs, by DecoderLayer's keyword names.
        args = {
            "encoded_BSD": encoded_BSD,
            "self_mask": self_mask,
            "cross_mask": cross_mask,
            "cache_index": cache_index,
            "positions_BT": positions_BT,
        }
        y_BTD, cache = stack(y_BTD, args, cache=cache, deterministic=deterministic)
        if cfg.use_final_norm:
            y_BTD = make_layer_norm(cfg, "final_norm")(y_BTD)
        if self.embed is None or not head:
            out = y_BTD
        elif cfg.tie_output_embedding:
            out = self.embed.attend(y_BTD).astype(jnp.float32)
            if cfg.output_bias:
                bias = self.param(
                    "logits_bias",
                    partitioned(nn.initializers.zeros_init(), (axes.VOCAB,)),
                    (cfg.output_vocab_size,),
                    cfg.param_dtype,
                )
                out = out + bias.astype(jnp.float32)
        else:
            out = nn.DenseGeneral(
                cfg.output_vocab_size,
                use_bias=cfg.output_bias,
                dtype=cfg.dtype,
                param_dtype=cfg.param_dtype,
                # Operands in dtype, sum and logits in float32 (`functional.precision`).
                dot_general=mixed_dot_general,
                name="logits",
                kernel_init=partitioned(
                    nn.initializers.normal(cfg.init_std), (axes.EMBED, axes.VOCAB)
                ),
                bias_init=partitioned(nn.initializers.zeros_init(), (axes.VOCAB,)),
            )(y_BTD.reshape(-1, y_BTD.shape[-1]))  # merged rows: see `functional.project`
            out = out.reshape(*y_BTD.shape[:-1], -1).astype(jnp.float32)
        if self.embed is not None and head and cfg.logits_soft_cap:
            out = soft_cap(out, cfg.logits_soft_cap)
        return out if cache is None else (out, cache)


def _embed_inputs(
    owner: str,
    cfg: TransformerConfig,
    embed: nn.Module | None,
    inputs: jax.Array,
    deterministic: bool,
    positions_BT: jax.Array | None,
) -> jax.Array:
    """Token embedding (times sqrt(D) if configured) or given embeddings, + positions, dropout.

    With `positional='rope'` nothing is added here: self-attention rotates queries and keys.
    """
    if embed is None:
        if not jnp.issubdtype(inputs.dtype, jnp.floating):
            raise ValueError(
                f"{owner}(embed=None) takes float embeddings (B, T, d_model), got "
                f"{inputs.dtype} {inputs.shape=}; token ids need an embed module."
            )
        check_model_width(owner, "inputs", inputs, cfg.d_model)
        x_BTD = inputs.astype(cfg.dtype)
    else:
        if inputs.ndim != 2 or not jnp.issubdtype(inputs.dtype, jnp.integer):
            raise ValueError(
                f"{owner} with an embed module takes int token ids (B, T), got "
                f"{inputs.dtype} {inputs.shape=}; for embeddings (B, T, D) build it with "
                "embed=None."
            )
        x_BTD = embed(inputs)
        if cfg.scale_embeddings:
            x_BTD = x_BTD * jnp.sqrt(cfg.d_model).astype(x_BTD.dtype)
    if cfg.positional != "rope":  # rotary positions live in self-attention instead
        x_BTD = _positions(cfg)(x_BTD, positions_BT=positions_BT)
    x_BTD = Dropout(rate=cfg.dropout_rate, deterministic=deterministic)(x_BTD)
    return nn.with_logical_constraint(x_BTD, (axes.BATCH, axes.LENGTH, axes.EMBED))


def _positions(cfg: TransformerConfig) -> PositionalEncoding:
    return PositionalEncoding(
        cfg.max_len, cfg.positional, param_dtype=cfg.param_dtype, name="positions"
    )
