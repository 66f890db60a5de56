"""MultiHeadAttention: fused projections for all heads, the KV cache, then one attention call.

The layer does three things in turn: project the queries, keys and values of all heads
(`_project_heads`), write or read the KV cache (`_update_cache`), and hand the heads to
`layers.attention_op.attention_op`, the one place that picks the implementation; then it
merges the heads with W_O (`_merge_heads`).

Rather than N small (D, H) matrices per head, the projections for all heads are one big
matrix (the paper §3.2.2 notes the heads cost about as much as one full-width head).
Self-attention uses one fused Q/K/V kernel `(D, 3, N, H)`; cross-attention a query kernel
`(D, N, H)` and a fused key/value kernel `(D, 2, N, H)`. The output projection W_O is
`(N, H, D)`.

Generation passes a per-layer KV cache in and gets it back (an explicit pytree, as Gemma
does): self-attention writes this call's keys/values at each sequence's own slots and
attends over the whole cache; cross-attention computes the encoder's keys/values once and
reads them back on every later step. The cache is head-major, `(B, N, L, H)`: each
(sequence, head) pair owns one contiguous `(L, H)` block, which is exactly the operand of
the single-head attention function, so a decoding step reads the cache in place instead of
transposing all of it (on a CPU this made attention over the cache 5x faster).

Grouped-query attention (`num_kv_heads` K < N): keys and values have K heads, query head i
reading key/value head `i // (N // K)` (Hugging Face Llama's `repeat_kv` grouping). Self-
attention then has a query kernel `(D, N, H)` and a fused key/value kernel `(D, 2, K, H)`
(the fused Q/K/V kernel needs K = N), and the cache holds K heads, `(B, K, L, H)`: N / K
times smaller. The K heads are shared through `vmap`, never copied.

Rotary positions (`rope=True`, self-attention only): queries and keys are rotated by their
positions (`functional.apply_rope`) after the projections, and keys are written to the
cache already rotated, so cached keys never need their positions again.

QK-norm (`qk_norm=True`, self- and cross-attention): each head's queries and keys go
through RMSNorm over the head width (`functional.rms_norm`, learned scales
`query_norm_scale`, `key_norm_scale` `(H,)` shared by the heads) right after the
projections, before the rotation; keys are cached normalised, like rotated.

LoRA (`lora_rank` > 0, `layers.lora`): each targeted projection's kernel is replaced, where
it is read (`_adapted`), by `W + (alpha / r) * A @ B`; a fused kernel gets one adapter pair
per targeted part. Every call reads the kernels the same way, so the KV-cache steps use
the adapted ones too.
"""

from __future__ import annotations

from typing import Any

import chex
import jax
import jax.numpy as jnp
from flax import linen as nn

from flax_transformer import axes
from flax_transformer.checks.arguments import as_array, check_floating, check_int
from flax_transformer.config import (
    DEFAULT_LORA_ALPHA,
    DEFAULT_LORA_TARGETS,
    check_attention_attributes,
)
from flax_transformer.functional import RMS_NORM_EPS, apply_rope, broadcast_mask, project, rms_norm
from flax_transformer.functional.attention import check_dropout
from flax_transformer.functional.positions import DEFAULT_ROPE_BASE
from flax_transformer.layers.attention_op import attention_op
from flax_transformer.layers.initializers import INIT_STD, ones_init, partitioned, zeros_init
from flax_transformer.layers.lora import adapt_kernel

# The LoRA target of each projection kernel, or of each part of a fused one (axis 1).
_LORA_PARTS = {"qkv": ("q", "k", "v"), "kv": ("k", "v"), "query": "q"}


class MultiHeadAttention(nn.Module):
    """Multi-head scaled dot-product attention (self, causal self, or cross).

    Attributes:
      num_heads: N; must divide the input width D.
      cross: False: queries, keys and values all come from `x_q` (fused Q/K/V kernel).
        True: keys and values come from `x_kv` (query kernel + fused K/V kernel).
      dropout_rate: dropout on the attention weights.
      use_bias: biases on the projections.
      impl: the attention implementation, chosen in one place (`layers.attention_op`):
        'xla' (our vmapped attention), 'jax_nn' (`jax.nn.dot_product_attention`; a call
        with dropout on, or with the 'intermediates' collection mutable, runs our formula
        instead: same result, weights sown), 'splash' (Pallas flash attention for TPUs;
        masks as `AttentionMask`, lengths multiples of 128) or 'cudnn' (cuDNN flash
        attention, GPU only). The fused 'splash' and 'cudnn' refuse attention dropout and a
        mutable 'intermediates' collection with a ValueError.
      init_std: standard deviation of the normal kernel init (INIT_STD = 0.02, as GPT-2).
      dtype, param_dtype: compute and storage dtypes (softmax in float32, or float64 for float64).
      num_kv_heads: K key/value heads, dividing N (grouped-query; 1: multi-query); None = N.
      rope: rotate queries and keys by their positions (rotary embeddings; self-attention
        only, cross=True with rope=True raises ValueError).
      rope_base: the rotary frequency base (DEFAULT_ROPE_BASE = 10000).
      lora_rank, lora_alpha, lora_targets: LoRA adapters (`layers.lora`; rank 0 = none) on
        the targeted projections among 'q', 'k', 'v', 'o' (other names are ignored: they
        are the feed-forward's). A fused kernel gets one adapter pair per targeted part:
        `lora_q`, `lora_k`, `lora_v`, `lora_o`, each with `lora_a`, `lora_b`.
      qk_norm: RMSNorm over the head width on every head's queries and keys, after the
        projections and before rotary positions, with learned scales `query_norm_scale`,
        `key_norm_scale` `(H,)` (init 1) shared by the heads. False: none, no parameters.
      qk_norm_eps: its epsilon (RMS_NORM_EPS = 1e-6; the blocks pass `layer_norm_eps`).
      attn_logit_softcapping: Gemma 2's attention-logit soft-capping: the scaled scores
        become `c * tanh(scores / c)` before the mask and the softmax; a finite number > 0,
        or None (off). Run by impl 'xla' and 'blocked' and over a cache; 'jax_nn',
        'splash' and 'cudnn' refuse it with a ValueError.

    Generation: pass `cache` (see `__call__`) and the call returns `(y, new_cache)` instead
    of `y`. A self-attention cache is `{'k': (B, K, L, H), 'v': (B, K, L, H)}` for L slots;
    a cross-attention cache is `{'k': (B, K, S, H), 'v': (B, K, S, H)}` (K = N unless
    `num_kv_heads`). With a cache the attention always runs our vmapped formula (`impl` is
    ignored).

    The attention weights `(B, N, T, S)` are sown into the 'intermediates' collection as
    'attention_weights' when that collection is mutable (off by default, free when off),
    and beside them what they came from as 'attention_inputs': `{'q': (B, T, N, H), 'k',
    'v': (B, S, K, H), 'mask': bool (B, N, T, S)}`, queries and keys after rotary positions.
    """

    num_heads: int
    cross: bool = False
    dropout_rate: float = 0.0
    use_bias: bool = True
    impl: str = "xla"
    init_std: float = INIT_STD
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32
    num_kv_heads: int | None = None
    rope: bool = False
    rope_base: float = DEFAULT_ROPE_BASE
    lora_rank: int = 0
    lora_alpha: float = DEFAULT_LORA_ALPHA
    lora_targets: tuple[str, ...] = DEFAULT_LORA_TARGETS
    qk_norm: bool = False
    qk_norm_eps: float = RMS_NORM_EPS
    attn_logit_softcapping: float | None = None

    def _adapted(self, kernel: jax.Array, names, parts, in_axes: int = 1) -> jax.Array:
        """The kernel in `dtype`, plus its LoRA updates where targeted (`layers.lora`)."""
        return adapt_kernel(
            kernel,
            names,
            parts,
            in_axes=in_axes,
            rank=self.lora_rank,
            alpha=self.lora_alpha,
            targets=self.lora_targets,
            dtype=self.dtype,
        )

    def _project(
        self, name: str, x_BTD: jax.Array, features: tuple[int, ...], names: tuple[str, ...]
    ) -> jax.Array:
        """x `(B, T, D)` @ kernel `(D, *features)` (+ bias) -> `(B, T, *features)` in `dtype`.

        The product and the bias are summed in float32 and rounded to `dtype` once, for the
        attention products that take it next (`functional.precision`).
        """
        width = x_BTD.shape[-1]
        kernel = self.param(
            f"{name}_kernel",
            partitioned(nn.initializers.normal(self.init_std), (axes.EMBED, *names)),
            (width, *features),
            self.param_dtype,
        )
        kernel = self._adapted(kernel, (axes.EMBED, *names), _LORA_PARTS[name])
        y = project(x_BTD.astype(self.dtype), kernel)
        if self.use_bias:
            bias = self.param(
                f"{name}_bias", partitioned(zeros_init, names), features, self.param_dtype
            )
            y = y + bias.astype(self.dtype)
        return y.astype(self.dtype)

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
        positions_BT: jax.Array | None = None,
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
          positions_BT: int `(B|1, T)`, with `rope` only: the positions of this call's
            queries/keys. Default `cache_index[:, None] + t` with a cache, else `0..T-1`.

        Returns:
          `(B, T, D)` in `dtype`; with a `cache`, the pair `(output, updated cache)`.
        """
        fn = "MultiHeadAttention"
        x_q = as_array(fn, "x_q", x_q)
        x_kv = None if x_kv is None else as_array(fn, "x_kv", x_kv)
        batch, q_len, width = self._check_call(fn, x_q, x_kv, cache)
        head_dim = width // self.num_heads
        q_BTNH, k_BSKH, v_BSKH = self._project_heads(x_q, x_kv, cache is not None)
        if self.qk_norm:
            q_BTNH, k_BSKH = self._normalize_heads(q_BTNH, k_BSKH, head_dim)
        if self.rope:
            positions_BT = _rope_positions(positions_BT, cache_index, batch, q_len)
            q_BTNH = apply_rope(q_BTNH, positions_BT, self.rope_base)
            k_BSKH = apply_rope(k_BSKH, positions_BT, self.rope_base)
        chex.assert_shape(q_BTNH, (batch, q_len, self.num_heads, head_dim))

        kv_head_axis = 2
        if cache is not None:
            # Attend over the whole cache, head-major (B, K, L, H), read in place.
            cache = self._update_cache(cache, k_BSKH, v_BSKH, cache_index)
            chex.assert_equal_shape([cache["k"], cache["v"]])
            chex.assert_shape(cache["k"], (batch, self._kv_heads, None, head_dim))
            k_BSKH, v_BSKH, kv_head_axis = cache["k"], cache["v"], 1
        else:
            chex.assert_equal_shape([k_BSKH, v_BSKH])
        out_BTNH = self._attend(q_BTNH, k_BSKH, v_BSKH, mask, kv_head_axis, deterministic)
        y_BTD = self._merge_heads(out_BTNH, width)
        return y_BTD if cache is None else (y_BTD, cache)

    def _normalize_heads(self, q_BTNH, k_BSKH, head_dim: int):
        """QK-norm: RMSNorm of every head's query and key vectors over H, with a learned
        `(H,)` scale each; keys may be None (a cross-attention step that reads the cache)."""
        scales = [
            self.param(name, partitioned(ones_init, (axes.KV,)), (head_dim,), self.param_dtype)
            for name in ("query_norm_scale", "key_norm_scale")
        ]
        q_BTNH = rms_norm(q_BTNH, scales[0], self.qk_norm_eps)
        if k_BSKH is not None:
            k_BSKH = rms_norm(k_BSKH, scales[1], self.qk_norm_eps)
        return q_BTNH, k_BSKH

    def _attend(self, q_BTNH, k_BSKH, v_BSKH, mask, kv_head_axis: int, deterministic: bool):
        """The attention kernel over projected heads -> `(B, T, N, H)`; sows the weights
        (and what they came from) when 'intermediates' is mutable."""
        use_dropout = not deterministic and self.dropout_rate > 0.0
        out_BTNH, weights_BNTS = attention_op(
            q_BTNH,
            k_BSKH,
            v_BSKH,
            mask,
            # Initialisation traces a dummy batch of a few tokens, which the fused kernels'
            # block sizes refuse; the parameters are the same whichever path runs.
            impl="xla" if self.is_initializing() else self.impl,
            kv_head_axis=kv_head_axis,
            dropout_rate=self.dropout_rate,
            dropout_rng=self.make_rng("dropout") if use_dropout else None,
            need_weights=self.is_mutable_collection("intermediates"),
            fn="MultiHeadAttention",
            logit_softcap=self.attn_logit_softcapping,
        )
        if weights_BNTS is not None:
            self.sow("intermediates", "attention_weights", weights_BNTS)
            self._sow_inputs(q_BTNH, k_BSKH, v_BSKH, mask, kv_head_axis)
        return out_BTNH

    def _sow_inputs(self, q_BTNH, k_BSKH, v_BSKH, mask, kv_head_axis: int) -> None:
        """Sows what the weights came from, for the attention explorer: queries `(B, T, N,
        H)`, keys and values `(B, S, K, H)` as attended (rotated, with a cache the whole
        cache) and the mask as bool `(B, N, T, S)`. Called only where the weights are
        sown, so it costs nothing when 'intermediates' is not mutable."""
        if kv_head_axis == 1:  # the cache, head-major
            k_BSKH, v_BSKH = _heads_major(k_BSKH), _heads_major(v_BSKH)
        batch, q_len, num_heads = q_BTNH.shape[:3]
        target = (batch, num_heads, q_len, k_BSKH.shape[1])
        mask_BNTS = jnp.ones(target, bool) if mask is None else broadcast_mask(mask, *target)
        inputs = {"q": q_BTNH, "k": k_BSKH, "v": v_BSKH, "mask": mask_BNTS}
        self.sow("intermediates", "attention_inputs", inputs)

    @property
    def _kv_heads(self) -> int:
        return self.num_kv_heads or self.num_heads

    def _check_call(self, fn, x_q, x_kv, cache) -> tuple[int, int, int]:
        """Shapes, dtypes and head counts, before any parameter is made: `(B, T, D)`."""
        check_attention_attributes(self)
        if jnp.ndim(x_q) != 3:
            raise ValueError(f"{fn}: x_q must be (B, T, D), got shape {jnp.shape(x_q)}.")
        check_floating(fn, "x_q", x_q)
        batch, q_len, width = x_q.shape
        check_int(fn, "num_heads", self.num_heads, low=1)
        if self.num_kv_heads is not None:
            check_int(fn, "num_kv_heads", self.num_kv_heads, low=1)
        if width % self.num_heads:
            raise ValueError(f"num_heads={self.num_heads} does not divide the input width {width}.")
        check_dropout(fn, self.dropout_rate)
        if self.num_heads % self._kv_heads:
            raise ValueError(
                f"num_kv_heads={self._kv_heads} does not divide num_heads={self.num_heads}; "
                "pick a divisor of num_heads."
            )
        if self.rope and self.cross:
            raise ValueError(
                "rope=True rotates self-attention only: cross-attention keys (the encoder's "
                "positions) and queries live on different sequences; build with rope=False."
            )
        if self.cross and x_kv is None and cache is None:
            raise ValueError("cross-attention needs x_kv (the encoder output).")
        if not self.cross and x_kv is not None:
            raise ValueError("self-attention takes no x_kv; build with cross=True.")
        if x_kv is not None:
            if jnp.ndim(x_kv) != 3 or x_kv.shape[0] != batch:
                raise ValueError(
                    f"{fn}: x_kv must be (B, S, D') with the queries' B={batch}, got shape "
                    f"{jnp.shape(x_kv)}."
                )
            check_floating(fn, "x_kv", x_kv)
        return batch, q_len, width

    def _project_heads(self, x_q, x_kv, cached: bool):
        """Queries `(B, T, N, H)` and this call's keys/values `(B, S, K, H)`.

        Self-attention with K = N uses the fused Q/K/V kernel. A cross-attention call with
        a cache and no `x_kv` has no new keys/values (they are in the cache): None, None.
        """
        width = x_q.shape[-1]
        nh = (self.num_heads, width // self.num_heads)
        kh = (self._kv_heads, width // self.num_heads)
        # K = N keeps the paper's parameter names and logical axes; fewer K/V heads get their
        # own axis name, which the sharding rules split only where K allows it.
        kv_names = (axes.HEADS if kh[0] == nh[0] else axes.KV_HEADS, axes.KV)
        if not self.cross and kh[0] == nh[0]:
            qkv_BT3NH = self._project("qkv", x_q, (3, *nh), (axes.QKV, axes.HEADS, axes.KV))
            return tuple(qkv_BT3NH[:, :, i] for i in range(3))
        q_BTNH = self._project("query", x_q, nh, (axes.HEADS, axes.KV))
        source = x_q if not self.cross else x_kv
        if source is None:
            return q_BTNH, None, None
        kv_BS2KH = self._project("kv", source, (2, *kh), (axes.QKV, *kv_names))
        return q_BTNH, kv_BS2KH[:, :, 0], kv_BS2KH[:, :, 1]

    def _update_cache(self, cache, k_BSKH, v_BSKH, cache_index):
        """The layer's cache after this call: self-attention writes this call's keys/values
        at each sequence's slots; cross-attention stores the encoder's once (when given)."""
        if not self.cross:
            return _write_cache(cache, k_BSKH, v_BSKH, cache_index)
        if k_BSKH is None:
            return cache
        return {
            "k": _heads_major(k_BSKH).astype(cache["k"].dtype),
            "v": _heads_major(v_BSKH).astype(cache["v"].dtype),
        }

    def _merge_heads(self, out_BTNH, width: int) -> jax.Array:
        """Concatenate the heads, then one `(N*H, D)` matmul with W_O (the paper §3.2.2)."""
        batch, q_len, num_heads, head_dim = out_BTNH.shape
        out_names = (axes.HEADS, axes.KV, axes.EMBED)
        w_out = self.param(
            "out_kernel",
            partitioned(nn.initializers.normal(self.init_std), out_names),
            (num_heads, head_dim, width),
            self.param_dtype,
        )
        w_out = self._adapted(w_out, out_names, "o", in_axes=2)
        # Merging (N, H) into one axis is free for the kernel; contracting over two axes
        # instead made XLA transpose the kernel on every decoding step.
        concat_BTK = out_BTNH.reshape(batch, q_len, num_heads * head_dim).astype(self.dtype)
        y_BTD = project(concat_BTK, w_out.reshape(num_heads * head_dim, width))
        if self.use_bias:
            b_out = self.param(
                "out_bias", partitioned(zeros_init, (axes.EMBED,)), (width,), self.param_dtype
            )
            y_BTD = y_BTD + b_out.astype(self.dtype)
        # Summed in float32 (`functional.precision`), rounded once for the residual stream.
        return y_BTD.astype(self.dtype)


def _heads_major(x_BSKH: jax.Array) -> jax.Array:
    return jnp.swapaxes(x_BSKH, 1, 2)


def _rope_positions(
    positions_BT: jax.Array | None, index_B: jax.Array | None, batch: int, length: int
) -> jax.Array:
    """`(B, T)` positions of this call's tokens: given, after the cache index, or 0..T-1."""
    if positions_BT is None:
        start_B1 = jnp.zeros((batch, 1), jnp.int32) if index_B is None else index_B[:, None]
        return start_B1 + jnp.arange(length)[None, :]
    positions_BT = jnp.asarray(positions_BT)
    if positions_BT.ndim != 2 or positions_BT.shape[1] != length:
        raise ValueError(
            f"positions_BT must be (B, T) or (1, T) with T={length}, got {positions_BT.shape=}."
        )
    return jnp.broadcast_to(positions_BT, (batch, length))


def _write_cache(
    cache: dict[str, jax.Array], k_BTKH: jax.Array, v_BTKH: jax.Array, index_B: jax.Array | None
) -> dict[str, jax.Array]:
    """Write this call's T keys/values of sequence b at cache slots `index_B[b] + t`.

    Each sequence has its own write position, so a batch of prompts of different lengths
    shares one cache. The scatter updates the `(B, K, L, H)` buffers in place under `jit`;
    writes past slot L - 1 are dropped (the models check that the real tokens fit,
    `cache.check_cache_room`, where the index is concrete).
    """
    batch, length = k_BTKH.shape[:2]
    if index_B is None:
        raise ValueError("a self-attention cache needs cache_index (B,): each sequence's slot.")
    chex.assert_shape(index_B, (batch,))
    slots_BT = index_B[:, None] + jnp.arange(length)[None, :]
    rows_B1 = jnp.arange(batch)[:, None]
    # Index arrays on axes 0 and 2 around a full slice: numpy puts the broadcast (B, T)
    # first, so the updates are (B, T, K, H), this call's layout.
    return {
        "k": cache["k"].at[rows_B1, :, slots_BT].set(k_BTKH.astype(cache["k"].dtype)),
        "v": cache["v"].at[rows_B1, :, slots_BT].set(v_BTKH.astype(cache["v"].dtype)),
    }
