"""The full models: encoder-decoder `Transformer` and GPT-style `DecoderOnlyTransformer`.

Both models also run incrementally for generation, over a KV cache that is an explicit
pytree passed in and returned (as Gemma does; `flax_transformer.decoding.cache` defines it,
`init_cache` builds it). `extend(tokens (B, T), cache, lengths)` runs T new tokens per
sequence in one pass (a whole prompt: parallel prefill; or one token: a decoding step),
writes their keys/values at slots `index[b] + t`, and advances `index[b]` by `lengths[b]`
(default T). Sequence b's token at slot j sits at position j, so right-padded prompts of
different lengths share one cache: the padding slots past `lengths[b]` are overwritten by
the next tokens and never attended to. New tokens that would not fit in the cache raise
a ValueError where the cache index is concrete (`decoding.cache.check_cache_room`; under
`jit` it is a tracer and the check cannot run: size the cache for every token).
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from flax_transformer.blocks import Decoder, Encoder
from flax_transformer.config import TransformerConfig
from flax_transformer.decoding.cache import cache_length, check_cache_room
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
    keys_B11T = padding_mask(tokens_BT, pad_id)
    return combine_masks(keys_B11T, causal_mask(tokens_BT.shape[1]) if causal else None)


def _extend_decoder(
    decoder: Decoder,
    config: TransformerConfig,
    vocab_size: int,
    tokens_BT: jax.Array,
    cache: dict,
    lengths_B: jax.Array | None,
    encoded_BSD: jax.Array | None,
) -> tuple[jax.Array, dict]:
    """Run `tokens_BT` through `decoder` over `cache`: the body of both models' `extend`."""
    check_tokens(tokens_BT, vocab_size, config.max_len, "tokens")
    batch, length = tokens_BT.shape
    index_B = cache["index"]
    chex.assert_shape(index_B, (batch,))
    check_cache_room(cache, length, lengths_B)
    slots = cache_length(cache)
    config.check_length(slots, "cache")
    positions_BT = index_B[:, None] + jnp.arange(length)[None, :]
    # Query t of sequence b sees the cache slots up to its own position (causal over slots);
    # slots past it hold padding or nothing yet.
    self_mask_B1TL = jnp.arange(slots)[None, None, None, :] <= positions_BT[:, None, :, None]
    cross_mask_B11S = None
    if "source_mask" in cache:
        cross_mask_B11S = cache["source_mask"][:, None, None, :]
    logits_BTV, decoder_cache = decoder(
        tokens_BT,
        encoded_BSD,
        self_mask_B1TL,
        cross_mask_B11S,
        positions_BT=positions_BT,
        cache=cache["decoder"],
        cache_index=index_B,
    )
    chex.assert_shape(logits_BTV, (batch, length, vocab_size))
    advance_B = jnp.full((batch,), length, jnp.int32) if lengths_B is None else lengths_B
    return logits_BTV, {
        **cache,
        "index": index_B + advance_B.astype(jnp.int32),
        "decoder": decoder_cache,
    }


def _embed(cfg: TransformerConfig, vocab_size: int, name: str) -> Embed:
    """A token embedding of the config's width, init and dtypes."""
    return Embed(
        vocab_size,
        cfg.d_model,
        init_std=cfg.embed_init_std,
        dtype=cfg.dtype,
        param_dtype=cfg.param_dtype,
        name=name,
    )


class Transformer(nn.Module):
    """Encoder-decoder Transformer (Vaswani et al. 2017; seed 000, "the full model").

    `apply(params, src_BS, tgt_BT)` -> float32 logits `(B, T, V)`. `tgt_BT` are the decoder
    inputs (BOS then the target shifted right); padding (`config.pad_id`) is masked in
    every attention. Dropout is on when `deterministic=False` (rng stream 'dropout').
    """

    config: TransformerConfig

    def setup(self):
        cfg = self.config
        src_embed = _embed(cfg, cfg.vocab_size, "embed")
        tgt_embed = src_embed
        if not cfg.share_embeddings:
            tgt_embed = _embed(cfg, cfg.output_vocab_size, "target_embed")
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
        cross_mask_B11S = padding_mask(src_BS, cfg.pad_id)
        logits = self.decoder(
            tgt_BT,
            encoded_BSD,
            _self_attention_mask(tgt_BT, cfg.pad_id, True),
            cross_mask_B11S,
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

    def prefill(
        self,
        src_BS: jax.Array,
        tgt_BT: jax.Array,
        cache: dict,
        lengths_B: jax.Array | None = None,
    ) -> tuple[jax.Array, dict]:
        """Encode the source once and run the decoder prompt `tgt_BT` over an empty cache.

        Fills the cross-attention keys/values of every layer from the encoder output (later
        `extend` calls reuse them) and the self-attention keys/values of the prompt.

        Args:
          src_BS: source ids `(B, S)`; padding masked.
          tgt_BT: decoder prompt `(B, T)`, usually `[[BOS]] * B`; right-padded if the
            prompts differ in length.
          cache: from `decoding.init_cache(config, B, L, source_length=S)`.
          lengths_B: real prompt length per sequence (default T).

        Returns:
          `(logits (B, T, V) float32, cache)`; row `lengths_B[b] - 1` predicts the next token.

        Raises:
          ValueError: the prompt does not fit in the cache (checked before the encoder runs,
            where the cache index is concrete; see `decoding.cache.check_cache_room` for
            what happens under `jit`).
        """
        cfg = self.config
        check_cache_room(cache, tgt_BT.shape[1], lengths_B)
        encoded_BSD = self.encode(src_BS)
        cache = {**cache, "source_mask": src_BS != cfg.pad_id}
        vocab = cfg.output_vocab_size
        return _extend_decoder(self.decoder, cfg, vocab, tgt_BT, cache, lengths_B, encoded_BSD)

    def extend(
        self, tgt_BT: jax.Array, cache: dict, lengths_B: jax.Array | None = None
    ) -> tuple[jax.Array, dict]:
        """Decoder over `tgt_BT` `(B, T)` after a `prefill`: `(logits (B, T, V), cache)`.

        The encoder output is not needed: cross-attention reads its cached keys/values.
        Raises ValueError, as `DecoderOnlyTransformer.extend`, if the tokens do not fit.
        """
        cfg = self.config
        vocab = cfg.output_vocab_size
        return _extend_decoder(self.decoder, cfg, vocab, tgt_BT, cache, lengths_B, None)


class DecoderOnlyTransformer(nn.Module):
    """GPT-style causal language model: a decoder stack without cross-attention.

    `apply(params, tokens_BT)` -> float32 logits `(B, T, V)`; logit t predicts token t+1.
    """

    config: TransformerConfig

    def setup(self):
        cfg = self.config
        self.embed = _embed(cfg, cfg.vocab_size, "embed")
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

    def extend(
        self, tokens_BT: jax.Array, cache: dict, lengths_B: jax.Array | None = None
    ) -> tuple[jax.Array, dict]:
        """Run `tokens_BT` `(B, T)` over the cache: a prompt (prefill) or one new token.

        Args:
          tokens_BT: token ids; prompts of different lengths right-padded.
          cache: from `decoding.init_cache(config, B, L)` or a previous `extend`.
          lengths_B: real tokens per row (default T); the cache index advances by this.

        Returns:
          `(logits (B, T, V) float32, cache)`; logits at row `lengths_B[b] - 1` predict the
          next token of sequence b.

        Raises:
          ValueError: the new tokens do not fit, `index[b] + lengths_B[b]` exceeds the
            cache's L slots (it names L, the index and the count). Checked where the cache
            index is a concrete array; under `jit` it is a tracer, nothing can be checked,
            and writes past slot L - 1 are dropped (a silent wrong result), so size the
            cache with `init_cache(config, B, L)` for every token, as `generate_text` does.
        """
        cfg = self.config
        return _extend_decoder(self.decoder, cfg, cfg.vocab_size, tokens_BT, cache, lengths_B, None)
