"""The full models: encoder-decoder `Transformer` and GPT-style `DecoderOnlyTransformer`."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from flax_transformer.blocks import Decoder, Encoder
from flax_transformer.config import TransformerConfig
from flax_transformer.functional import causal_mask, combine_masks, padding_mask
from flax_transformer.layers import Embed


def check_tokens(tokens: jax.Array, vocab_size: int, max_len: int, name: str) -> None:
    """Raise ValueError for a bad token array before any compute is spent.

    Shape, dtype and length are checked always; the id range only for concrete arrays
    (under `jit` values are unknown, and JAX gathers would silently clamp a bad id, so data
    pipelines check ids where they enter).
    """
    if tokens.ndim != 2:
        raise ValueError(f"{name} must be int token ids of shape (B, T), got {tokens.shape=}.")
    if not jnp.issubdtype(tokens.dtype, jnp.integer):
        raise ValueError(f"{name} must hold integer token ids, got dtype {tokens.dtype}.")
    if tokens.shape[1] > max_len:
        raise ValueError(
            f"{name} length {tokens.shape[1]} exceeds TransformerConfig.max_len={max_len}; "
            "shorten the input or raise max_len."
        )
    if isinstance(tokens, jax.core.Tracer):
        return
    values = np.asarray(tokens)
    if values.size and (values.min() < 0 or values.max() >= vocab_size):
        bad = values[(values < 0) | (values >= vocab_size)][0]
        where = tuple(int(i) for i in np.argwhere(values == bad)[0])
        raise ValueError(
            f"{name} holds token id {bad} at {where}, outside the vocabulary [0, {vocab_size}); "
            "check the tokenizer's vocab_size against TransformerConfig.vocab_size."
        )


def _self_attention_mask(tokens_BT: jax.Array, pad_id: int, causal: bool) -> jax.Array:
    """`(B, 1, T, T)`: keys that are not padding (and, if causal, not in the future)."""
    keys_B11T = padding_mask(tokens_BT, pad_id)[:, None]
    return combine_masks(keys_B11T, causal_mask(tokens_BT.shape[1]) if causal else None)


class Transformer(nn.Module):
    """Encoder-decoder Transformer (Vaswani et al. 2017; seed 000, "the full model").

    `apply(params, src_BS, tgt_BT)` -> float32 logits `(B, T, V)`. `tgt_BT` are the decoder
    inputs (BOS then the target shifted right); padding (`config.pad_id`) is masked in
    every attention. Dropout is on when `deterministic=False` (rng stream 'dropout').
    """

    config: TransformerConfig

    def setup(self):
        cfg = self.config
        src_embed = Embed(
            cfg.vocab_size, cfg.d_model, dtype=cfg.dtype, param_dtype=cfg.param_dtype, name="embed"
        )
        tgt_embed = src_embed
        if not cfg.share_embeddings:
            tgt_embed = Embed(
                cfg.output_vocab_size,
                cfg.d_model,
                dtype=cfg.dtype,
                param_dtype=cfg.param_dtype,
                name="target_embed",
            )
        self.encoder = Encoder(cfg, src_embed)
        self.decoder = Decoder(cfg, tgt_embed, cross_attention=True)

    def encode(self, src_BS: jax.Array, *, deterministic: bool = True) -> jax.Array:
        """Source ids `(B, S)` -> encoded `(B, S, D)`."""
        cfg = self.config
        check_tokens(src_BS, cfg.vocab_size, cfg.max_len, "src_tokens")
        encoded = self.encoder(
            src_BS, _self_attention_mask(src_BS, cfg.pad_id, False), deterministic=deterministic
        )
        chex.assert_shape(encoded, (*src_BS.shape, cfg.d_model))
        return encoded

    def decode(
        self,
        encoded_BSD: jax.Array,
        src_BS: jax.Array,
        tgt_BT: jax.Array,
        *,
        deterministic: bool = True,
    ) -> jax.Array:
        """Decoder over the encoder output: `(B, S, D)`, `(B, S)`, `(B, T)` -> logits `(B, T, V)`.

        `src_BS` is needed only for its padding mask.
        """
        cfg = self.config
        check_tokens(tgt_BT, cfg.output_vocab_size, cfg.max_len, "tgt_tokens")
        chex.assert_rank(encoded_BSD, 3)
        chex.assert_equal_shape_prefix([encoded_BSD, src_BS], 2)
        cross_mask = padding_mask(src_BS, cfg.pad_id)[:, None]  # (B, 1, 1, S)
        logits = self.decoder(
            tgt_BT,
            encoded_BSD,
            _self_attention_mask(tgt_BT, cfg.pad_id, True),
            cross_mask,
            deterministic=deterministic,
        )
        chex.assert_shape(logits, (*tgt_BT.shape, cfg.output_vocab_size))
        return logits

    def __call__(
        self, src_BS: jax.Array, tgt_BT: jax.Array, *, deterministic: bool = True
    ) -> jax.Array:
        """Source ids `(B, S)`, decoder input ids `(B, T)` -> float32 logits `(B, T, V)`."""
        if src_BS.shape[:1] != tgt_BT.shape[:1]:
            raise ValueError(
                f"src and tgt need the same batch size: {src_BS.shape=}, {tgt_BT.shape=}."
            )
        encoded = self.encode(src_BS, deterministic=deterministic)
        return self.decode(encoded, src_BS, tgt_BT, deterministic=deterministic)


class DecoderOnlyTransformer(nn.Module):
    """GPT-style causal language model: a decoder stack without cross-attention.

    `apply(params, tokens_BT)` -> float32 logits `(B, T, V)`; logit t predicts token t+1.
    """

    config: TransformerConfig

    def setup(self):
        cfg = self.config
        self.embed = Embed(
            cfg.vocab_size, cfg.d_model, dtype=cfg.dtype, param_dtype=cfg.param_dtype, name="embed"
        )
        self.decoder = Decoder(cfg, self.embed, cross_attention=False)

    def __call__(self, tokens_BT: jax.Array, *, deterministic: bool = True) -> jax.Array:
        cfg = self.config
        check_tokens(tokens_BT, cfg.vocab_size, cfg.max_len, "tokens")
        logits = self.decoder(
            tokens_BT,
            None,
            _self_attention_mask(tokens_BT, cfg.pad_id, True),
            None,
            deterministic=deterministic,
        )
        chex.assert_shape(logits, (*tokens_BT.shape, cfg.vocab_size))
        return logits
