"""MultiHeadAttention: fused projections for all heads around `functional.multi_head_attention`.

Seed 000: rather than N small (D, H) matrices per head, the projections for all heads are
one big matrix. Self-attention uses one fused Q/K/V kernel `(D, 3, N, H)`; cross-attention
a query kernel `(D, N, H)` and a fused key/value kernel `(D, 2, N, H)`. The output
projection W_O is `(N, H, D)`.

Generation passes a per-layer KV cache in and gets it back (an explicit pytree, as Gemma
does): self-attention writes this call's keys/values at each sequence's own slots and
attends over the whole cache; cross-attention computes the encoder's keys/values once and
reads them back on every later step. The cache is head-major, `(B, N, L, H)`: each
(sequence, head) pair owns one contiguous `(L, H)` block, which is exactly the operand of
the single-head attention function, so a decoding step reads the cache in place instead of
transposing all of it (on a CPU this made attention over the cache 5x faster).
"""

from __future__ import annotations

from typing import Any

import chex
import jax
import jax.numpy as jnp
from flax import linen as nn

from flax_transformer import axes
from flax_transformer.functional import (
    broadcast_mask,
    dot_product_attention,
    multi_head_attention,
)
from flax_transformer.layers.initializers import INIT_STD, partitioned, zeros_init


class MultiHeadAttention(nn.Module):
    """Multi-head scaled dot-product attention (self, causal self, or cross).

    Attributes:
      num_heads: N; must divide the input width D.
      cross: False: queries, keys and values all come from `x_q` (fused Q/K/V kernel).
        True: keys and values come from `x_kv` (query kernel + fused K/V kernel).
      dropout_rate: dropout on the attention weights.
      use_bias: biases on the projections.
      impl: 'xla' (our vmapped attention) or 'jax_nn' (`jax.nn.dot_product_attention`,
        which may pick a fused kernel such as cuDNN flash attention). That function returns
        no weights and has no attention dropout, so a 'jax_nn' call with dropout on, or with
        the 'intermediates' collection mutable, runs our formula instead (same result, and
        the weights are sown as with 'xla').
      init_std: standard deviation of the normal kernel init (INIT_STD = 0.02, seed 000).
      dtype, param_dtype: compute and storage dtypes (softmax in float32, or float64 for float64).

    Generation: pass `cache` (see `__call__`) and the call returns `(y, new_cache)` instead
    of `y`. A self-attention cache is `{'k': (B, N, L, H), 'v': (B, N, L, H)}` for L slots;
    a cross-attention cache is `{'k': (B, N, S, H), 'v': (B, N, S, H)}`. With a cache the
    attention always runs our vmapped formula (`impl` is ignored).

    The attention weights `(B, N, T, S)` are sown into the 'intermediates' collection as
    'attention_weights' when that collection is mutable (off by default, free when off).
    """

    num_heads: int
    cross: bool = False
    dropout_rate: float = 0.0
    use_bias: bool = True
    impl: str = "xla"
    init_std: float = INIT_STD
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    def _project(
        self, name: str, x_BTD: jax.Array, features: tuple[int, ...], names: tuple[str, ...]
    ) -> jax.Array:
        """x `(B, T, D)` @ kernel `(D, *features)` (+ bias) -> `(B, T, *features)`."""
        width = x_BTD.shape[-1]
        kernel = self.param(
            f"{name}_kernel",
            partitioned(nn.initializers.normal(self.init_std), (axes.EMBED, *names)),
            (width, *features),
            self.param_dtype,
        )
        y = jnp.tensordot(x_BTD.astype(self.dtype), kernel.astype(self.dtype), axes=1)
        if self.use_bias:
            bias = self.param(
                f"{name}_bias", partitioned(zeros_init, names), features, self.param_dtype
            )
            y = y + bias.astype(self.dtype)
        return y

    @nn.compact
    def __call__(
        self,
        x_q: jax.Array,
        x_kv: jax.Array | None = None,
        mask: jax.Array | None = None,
        *,
        deterministic: bool = True,
        cache: dict[str, jax.Array] | None = None,
        cache_index: jax.Array | None = None,
    ) -> jax.Array | tuple[jax.Array, dict[str, jax.Array]]:
        """Attend from `x_q` to itself (cross=False) or to `x_kv` (cross=True).

        Args:
          x_q: queries' inputs `(B, T, D)`.
          x_kv: keys'/values' inputs `(B, S, D)`; required iff `cross`, except when a
            cross-attention `cache` already holds the keys/values (then pass None).
          mask: bool, True where attention is allowed, of rank 2, `(T, S)`, or rank 4,
            `(B|1, N|1, T, S)` (e.g. `combine_masks(causal_mask(T), padding_mask(tokens))`,
            `(B, 1, T, S)`). A rank-3 mask raises ValueError: broadcasting would align its
            first axis with the heads, not the batch (write `mask[:, None]`). With a
            self-attention cache, S is the cache length L (key = cache slot).
          deterministic: disable dropout (else the 'dropout' rng stream is used).
          cache: optional KV cache of this layer, `{'k', 'v'}` as in the class docstring.
          cache_index: int `(B,)`, self-attention with a cache only: the slot where each
            sequence's first query of this call is written (its tokens so far).

        Returns:
          `(B, T, D)` in `dtype`; with a `cache`, the pair `(output, updated cache)`.
        """
        chex.assert_rank(x_q, 3)
        batch, q_len, width = x_q.shape
        if width % self.num_heads:
            raise ValueError(f"num_heads={self.num_heads} does not divide the input width {width}.")
        head_dim = width // self.num_heads
        nh = (self.num_heads, head_dim)
        use_dropout = not deterministic and self.dropout_rate > 0.0
        rng = self.make_rng("dropout") if use_dropout else None
        if self.cross:
            q_BTNH = self._project("query", x_q, nh, (axes.HEADS, axes.KV))
            if x_kv is not None:
                chex.assert_rank(x_kv, 3)
                kv_BS2NH = self._project("kv", x_kv, (2, *nh), (axes.QKV, axes.HEADS, axes.KV))
                k_BSNH, v_BSNH = kv_BS2NH[:, :, 0], kv_BS2NH[:, :, 1]
                if cache is not None:
                    cache = {
                        "k": _heads_major(k_BSNH).astype(cache["k"].dtype),
                        "v": _heads_major(v_BSNH).astype(cache["v"].dtype),
                    }
            elif cache is None:
                raise ValueError("cross-attention needs x_kv (the encoder output).")
        else:
            if x_kv is not None:
                raise ValueError("self-attention takes no x_kv; build with cross=True.")
            qkv_BT3NH = self._project("qkv", x_q, (3, *nh), (axes.QKV, axes.HEADS, axes.KV))
            q_BTNH, k_BSNH, v_BSNH = (qkv_BT3NH[:, :, i] for i in range(3))
            if cache is not None:
                cache = _write_cache(cache, k_BSNH, v_BSNH, cache_index)
        chex.assert_shape(q_BTNH, (batch, q_len, *nh))

        if cache is not None:
            chex.assert_equal_shape([cache["k"], cache["v"]])
            chex.assert_shape(cache["k"], (batch, *nh[:1], None, nh[1]))
            out_BTNH, weights_BNTS = _attend_heads_major(
                q_BTNH, cache["k"], cache["v"], mask, self.dropout_rate, rng
            )
            self.sow("intermediates", "attention_weights", weights_BNTS)
        elif (
            self.impl == "jax_nn"
            and not use_dropout
            and not self.is_mutable_collection("intermediates")
        ):
            chex.assert_equal_shape([k_BSNH, v_BSNH])
            if mask is not None:
                mask = broadcast_mask(mask, batch, self.num_heads, q_len, k_BSNH.shape[1])
            out_BTNH = jax.nn.dot_product_attention(q_BTNH, k_BSNH, v_BSNH, mask=mask)
        else:
            chex.assert_equal_shape([k_BSNH, v_BSNH])
            out_BTNH, weights_BNTS = multi_head_attention(
                q_BTNH,
                k_BSNH,
                v_BSNH,
                mask,
                dropout_rate=self.dropout_rate,
                dropout_rng=rng,
            )
            self.sow("intermediates", "attention_weights", weights_BNTS)

        w_out = self.param(
            "out_kernel",
            partitioned(nn.initializers.normal(self.init_std), (axes.HEADS, axes.KV, axes.EMBED)),
            (*nh, width),
            self.param_dtype,
        )
        # Concatenate the heads, then one (N*H, D) matmul (seed 003). Merging (N, H) into one
        # axis is free for the kernel; contracting over two axes instead made XLA transpose
        # the kernel on every decoding step.
        concat_BTK = out_BTNH.reshape(batch, q_len, width).astype(self.dtype)
        y_BTD = jnp.einsum(
            "btk,kd->btd", concat_BTK, w_out.reshape(width, width).astype(self.dtype)
        )
        if self.use_bias:
            b_out = self.param(
                "out_bias", partitioned(zeros_init, (axes.EMBED,)), (width,), self.param_dtype
            )
            y_BTD = y_BTD + b_out.astype(self.dtype)
        return y_BTD if cache is None else (y_BTD, cache)


def _heads_major(x_BSNH: jax.Array) -> jax.Array:
    return jnp.swapaxes(x_BSNH, 1, 2)


def _write_cache(
    cache: dict[str, jax.Array], k_BTNH: jax.Array, v_BTNH: jax.Array, index_B: jax.Array | None
) -> dict[str, jax.Array]:
    """Write this call's T keys/values of sequence b at cache slots `index_B[b] + t`.

    Each sequence has its own write position, so a batch of prompts of different lengths
    shares one cache. The scatter updates the `(B, N, L, H)` buffers in place under `jit`;
    writes past slot L - 1 are dropped (the models check that the real tokens fit,
    `decoding.cache.check_cache_room`, where the index is concrete).
    """
    batch, length = k_BTNH.shape[:2]
    if index_B is None:
        raise ValueError("a self-attention cache needs cache_index (B,): each sequence's slot.")
    chex.assert_shape(index_B, (batch,))
    slots_BT = index_B[:, None] + jnp.arange(length)[None, :]
    rows_B1 = jnp.arange(batch)[:, None]
    # Index arrays on axes 0 and 2 around a full slice: numpy puts the broadcast (B, T)
    # first, so the updates are (B, T, N, H), this call's layout.
    return {
        "k": cache["k"].at[rows_B1, :, slots_BT].set(k_BTNH.astype(cache["k"].dtype)),
        "v": cache["v"].at[rows_B1, :, slots_BT].set(v_BTNH.astype(cache["v"].dtype)),
    }


def _attend_heads_major(
    q_BTNH: jax.Array,
    k_BNSH: jax.Array,
    v_BNSH: jax.Array,
    mask: jax.Array | None,
    dropout_rate: float,
    dropout_rng: jax.Array | None,
) -> tuple[jax.Array, jax.Array]:
    """`multi_head_attention` over a head-major cache: `dot_product_attention` vmapped.

    Returns `(out (B, T, N, H), weights (B, N, T, S))` as `multi_head_attention` does.
    """
    batch, q_len, num_heads, _ = q_BTNH.shape
    kv_len = k_BNSH.shape[2]
    mask_BNTS = None if mask is None else broadcast_mask(mask, batch, num_heads, q_len, kv_len)
    keys = None
    if dropout_rng is not None and dropout_rate > 0.0:
        keys = jax.random.split(dropout_rng, (batch, num_heads))

    def one_head(q_TH, k_SH, v_SH, mask_TS, key):
        return dot_product_attention(
            q_TH, k_SH, v_SH, mask_TS, dropout_rate=dropout_rate, dropout_rng=key
        )

    mask_axis, key_axis = (None if mask is None else 0), (None if keys is None else 0)
    per_head = jax.vmap(one_head, in_axes=(1, 0, 0, mask_axis, key_axis), out_axes=(1, 0))
    per_batch = jax.vmap(per_head, in_axes=(0, 0, 0, mask_axis, key_axis), out_axes=(0, 0))
    return per_batch(q_BTNH, k_BNSH, v_BNSH, mask_BNTS, keys)
