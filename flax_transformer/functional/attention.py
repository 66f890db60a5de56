"""Scaled dot-product attention (Vaswani et al. 2017, §3.2.1-3.2.2; Happy-LLM ch. 2; Raschka ch. 3).

    Attention(Q, K, V) = softmax(Q K^T * scale) V,   scale = 1 / sqrt(d_k) by default.

`dot_product_attention` is the single-head, single-example formula; `multi_head_attention`
lifts it with `jax.vmap` over heads and then batch, which XLA turns into batched matmuls.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from flax_transformer.checks.arguments import (
    as_array,
    check_bool_mask,
    check_floating,
    check_number,
)
from flax_transformer.functional.dropout import dropout
from flax_transformer.functional.masks import as_dense
from flax_transformer.functional.precision import mixed_einsum
from flax_transformer.functional.soft_cap import soft_cap

# Score given to a masked (query, key) pair before the softmax. The smallest finite float32:
# exp(MASK_VALUE - max) underflows to exactly 0, and unlike -inf it never produces NaN
# (Gemma's K_MASK and MaxText's DEFAULT_MASK_VALUE make the same choice).
MASK_VALUE = float(jnp.finfo(jnp.float32).min)


# The ranks a multi-head attention mask may have: 2, `(T, S)`, shared by every example and
# head, or 4, `(B|1, N|1, T, S)`. Rank 3 is refused: broadcasting aligns trailing axes, so a
# `(B, T, S)` mask would put example b's mask on head b.
MASK_RANKS = (2, 4)


def _check_rank(name: str, x: jax.Array, rank: int) -> None:
    if x.ndim != rank:
        raise ValueError(f"{name} must have rank {rank}, got {name}.shape={x.shape}.")


def softmax_dtype(*dtypes) -> jnp.dtype:
    """The dtype attention scores and softmax run in: float32, or wider if an input is wider.

    bfloat16/float16/float32 inputs give float32 (softmax in float32, as mixed-precision
    code does); float64 inputs (under `jax_enable_x64`) keep float64, so gradient checks in
    float64 hold.
    """
    return jnp.promote_types(jnp.result_type(*dtypes), jnp.float32)


def broadcast_mask(
    mask: jax.Array,
    batch: int,
    num_heads: int,
    q_len: int,
    kv_len: int,
    *,
    fn: str = "multi_head_attention",
) -> jax.Array:
    """The bool `(B, N, T, S)` mask of a rank-2 `(T, S)` or rank-4 `(B|1, N|1, T, S)` mask.

    Raises:
      TypeError: the mask is not bool (an additive float mask or a 0/1 int mask: the message
        gives the conversion).
      ValueError: the mask has another rank (rank 3 above all: its first axis would be
        broadcast against the heads, not the batch); or it is rank 2 with B == T > 1 and a
        first axis of B, where a `(B, S)` padding mask and a `(T, S)` mask cannot be told
        apart; or it does not broadcast to `(B, N, T, S)`.
    """
    target = (batch, num_heads, q_len, kv_len)
    mask = as_dense(mask, q_len, kv_len)
    if mask is None:  # an AttentionMask that masks nothing
        return jnp.ones(target, jnp.bool_)
    mask = check_bool_mask(fn, mask)
    if mask.ndim not in MASK_RANKS:
        hint = {
            1: "for a key mask (S,) pass mask[None, :] (rank 2, (1, S))",
            3: (
                "a rank-3 mask is ambiguous: broadcasting would line its first axis up with "
                "the heads N, not the batch B. For a per-example (B, T, S) mask add the head "
                "axis, mask[:, None] -> (B, 1, T, S); padding_mask(tokens (B, S)) already "
                "returns (B, 1, 1, S)"
            ),
        }.get(mask.ndim, "reshape it to one of those ranks")
        raise ValueError(
            f"{fn}: mask.shape={mask.shape} has rank {mask.ndim}; attention takes a mask of "
            f"rank 2, (T, S) shared by every example and head, or rank 4, (B or 1, N or 1, T, "
            f"S) (here (B, N, T, S)={target}): {hint}."
        )
    if mask.ndim == 2 and batch > 1 and batch == q_len and mask.shape[0] == batch:
        raise ValueError(
            f"{fn}: mask.shape={mask.shape} is rank 2 while B == T == {batch}, so it could be a "
            "(T, S) mask or a (B, S) padding mask, which mean different things. Pass rank 4: "
            "mask[None, None] for a (T, S) mask shared by every example, mask[:, None, None, "
            ":] for a (B, S) padding mask (padding_mask(tokens) builds that)."
        )
    try:
        return jnp.broadcast_to(mask, target)
    except ValueError as err:
        hint = ""
        if mask.ndim == 2 and mask.shape[0] == batch and mask.shape[1] == kv_len:
            hint = (
                " It looks like a (B, S) padding mask: pass mask[:, None, None, :] "
                "(B, 1, 1, S), or padding_mask(tokens)."
            )
        raise ValueError(
            f"{fn}: mask.shape={mask.shape} does not broadcast to (B, N, T, S)={target}; each "
            f"axis must equal the one of (B, N, T, S) or be 1 (rank 2 is read as (T, S)).{hint}"
        ) from err


def dot_product_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    mask: jax.Array | None = None,
    *,
    scale: float | None = None,
    dropout_rate: float = 0.0,
    dropout_rng: jax.Array | None = None,
    logit_softcap: float | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Single-head attention of one example.

    Args:
      q: queries `(T, H)` (H = d_k).
      k: keys `(S, H)`.
      v: values `(S, Hv)`.
      mask: optional bool of rank 2, `(T, S)` or broadcastable to it (`(1, S)`: a key mask);
        True where the query may attend. Batched or per-head masks go to
        `multi_head_attention`. Other dtypes raise TypeError: an additive float mask `m`
        (0 = attend, -inf = blocked) is `m == 0`.
      scale: multiplier of the scores; None means `1/sqrt(H)`, 1.0 the unscaled form.
      dropout_rate: probability in [0, 1) of dropping an attention weight (applied to the
        weights that multiply V; the returned weights are the ones before dropout).
      dropout_rng: PRNG key; dropout runs only when it is given and `dropout_rate > 0`.
      logit_softcap: Gemma 2's attention-logit soft-capping: the scaled scores become
        `c * tanh(scores / c)` before the mask and the softmax (`soft_cap`); a finite
        number > 0, or None (off).

    Returns:
      `(out (T, Hv), weights (T, S))`. The scores and softmax run in float32, or in float64
      when an input is float64 (`softmax_dtype`); `q . k` and `p . v` take their operands
      in the inputs' dtype and sum in float32 (`functional.precision`, the weights rounded
      to `v.dtype` for `p . v`); `out` is cast back to `q.dtype` and
      `weights` stays in the softmax dtype. A query row that may attend to no key gets
      all-zero weights and a zero output (never NaN), and a key that no query may attend
      to (padding) never reaches the output or a gradient, even if its key or value is NaN
      or inf. (A NaN value
      that some query sees still reaches that query, as it should; and under causal masking
      it also reaches earlier queries through their zero weights: 0 * NaN.)

    Raises:
      TypeError: q, k or v is not floating (integer inputs would truncate), or the mask is
        not bool.
      ValueError: wrong ranks or shapes; dropout_rate outside [0, 1); a non-finite scale;
        a logit_softcap that is not None or a finite number > 0.
    """
    fn = "dot_product_attention"
    q, k, v = as_array(fn, "q", q), as_array(fn, "k", k), as_array(fn, "v", v)
    for name, x in (("q", q), ("k", k), ("v", v)):
        _check_rank(name, x, 2)
        check_floating(fn, name, x)
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k need the same last axis (d_k): {q.shape=}, {k.shape=}.")
    if k.shape[0] != v.shape[0]:
        raise ValueError(f"k and v need the same length S: {k.shape=}, {v.shape=}.")
    check_dropout(fn, dropout_rate)
    check_logit_softcap(fn, logit_softcap)
    if mask is not None:
        mask = check_bool_mask(fn, mask)
        if mask.ndim != 2:
            raise ValueError(
                f"dot_product_attention attends one example with one head: mask must have "
                f"rank 2, (T, S) (or (1, S) for a key mask), got {mask.shape=}; pass batched "
                "or per-head masks to multi_head_attention."
            )
        try:
            mask_TS = jnp.broadcast_to(mask, (q.shape[0], k.shape[0]))
        except ValueError as err:
            raise ValueError(
                f"mask.shape={mask.shape} does not broadcast to (T, S)={(q.shape[0], k.shape[0])}."
            ) from err
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    else:
        scale = check_number(fn, "scale", scale)

    dtype = softmax_dtype(q.dtype, k.dtype)
    if mask is not None:
        # A zero weight times a NaN or inf value is NaN: the keys and values of keys that
        # no query may see (padding) are replaced, not multiplied by zero, so they never
        # reach the output whatever they hold, nor the queries' gradient (dq = dscores k).
        seen_S1 = jnp.any(mask_TS, axis=0)[:, None]
        k = jnp.where(seen_S1, k, jnp.zeros((), k.dtype))
        v = jnp.where(seen_S1, v, jnp.zeros((), v.dtype))
    # Both products under the mixed-precision policy (`functional.precision`): operands in
    # the inputs' dtype, sums in float32.
    scores_TS = mixed_einsum("th,sh->ts", q, k)
    scores_TS = scores_TS.astype(dtype) * scale
    if logit_softcap is not None:
        scores_TS = soft_cap(scores_TS, logit_softcap)
    if mask is not None:
        scores_TS = jnp.where(mask_TS, scores_TS, MASK_VALUE)
        weights_TS = jax.nn.softmax(scores_TS, axis=-1)
        # A row with no visible key would otherwise be uniform over masked keys.
        weights_TS = jnp.where(mask_TS, weights_TS, 0.0)
    else:
        weights_TS = jax.nn.softmax(scores_TS, axis=-1)

    used_TS = weights_TS
    if dropout_rng is not None and dropout_rate > 0.0:
        used_TS = dropout(used_TS, dropout_rate, dropout_rng)

    out = mixed_einsum("ts,sh->th", used_TS, v, dtype=v.dtype)
    if mask is not None:
        # A query that sees no key gets zeros, even where a key only others see holds NaN.
        out = jnp.where(jnp.any(mask_TS, axis=1)[:, None], out, jnp.zeros((), out.dtype))
    return out.astype(q.dtype), weights_TS


def check_dropout(fn: str, rate: float) -> None:
    """ValueError unless the attention dropout rate is a finite number in [0, 1)."""
    check_number(fn, "dropout_rate", rate, low=0.0, high=1.0, high_open=True)


def check_logit_softcap(fn: str, cap: float | None, name: str = "logit_softcap") -> None:
    """ValueError unless the attention-logit cap is None (off) or a finite number > 0."""
    if cap is not None:
        check_number(fn, name, cap, low=0.0, low_open=True)


def multi_head_attention(
    q_BTNH: jax.Array,
    k_BSNH: jax.Array,
    v_BSNH: jax.Array,
    mask: jax.Array | None = None,
    *,
    scale: float | None = None,
    dropout_rate: float = 0.0,
    dropout_rng: jax.Array | None = None,
    logit_softcap: float | None = None,
) -> tuple[jax.Array, jax.Array]:
    """`dot_product_attention` lifted with `jax.vmap` over heads, then batch.

    Keys and values may have fewer heads K than the queries' N (grouped-query attention,
    Ainslie et al. 2023; K = 1 is multi-query attention), K dividing N: query head i reads
    key/value head `i // (N // K)`, the grouping of Hugging Face's Llama (`repeat_kv`) and
    of `jax.nn.dot_product_attention`. The K heads are shared through `vmap`, never copied.

    Args:
      q_BTNH: queries `(B, T, N, H)`.
      k_BSNH: keys `(B, S, K, H)`: K = N (multi-head), or a divisor of N.
      v_BSNH: values `(B, S, K, Hv)`.
      mask: optional bool mask, True where the query may attend, of rank 2, `(T, S)` for
        every example and head, or rank 4, `(B|1, N|1, T, S)`, e.g. `(B, 1, T, S)` or
        `(B, 1, 1, S)` (`padding_mask`). Rank 3 raises ValueError: broadcasting would align
        a `(B, T, S)` mask's first axis with the heads; write `mask[:, None]`. So does a
        rank-2 mask `(B, S)` when B == T > 1 (it cannot be told from a `(T, S)` mask): pass
        rank 4. A non-bool mask raises TypeError (`broadcast_mask`).
      scale, dropout_rate, logit_softcap: as in `dot_product_attention`.
      dropout_rng: one key; it is split so that every (example, head) drops independently.

    Returns:
      `(out (B, T, N, Hv), weights (B, N, T, S))`, weights in float32 (float64 for float64
      inputs).
    """
    fn = "multi_head_attention"
    q_BTNH = as_array(fn, "q_BTNH", q_BTNH)
    k_BSNH = as_array(fn, "k_BSNH", k_BSNH)
    v_BSNH = as_array(fn, "v_BSNH", v_BSNH)
    for name, x in (("q_BTNH", q_BTNH), ("k_BSNH", k_BSNH), ("v_BSNH", v_BSNH)):
        _check_rank(name, x, 4)
        check_floating(fn, name, x)
    batch = q_BTNH.shape[0]
    if k_BSNH.shape[0] != batch or v_BSNH.shape[0] != batch:
        raise ValueError(
            f"{fn}: q, k and v need the same batch axis B: {q_BTNH.shape=}, {k_BSNH.shape=}, "
            f"{v_BSNH.shape=}."
        )
    if k_BSNH.shape[1:3] != v_BSNH.shape[1:3]:
        raise ValueError(
            f"{fn}: k and v need the same length S and head count K, (B, S, K, H): "
            f"{k_BSNH.shape=}, {v_BSNH.shape=}."
        )
    if q_BTNH.shape[-1] != k_BSNH.shape[-1]:
        raise ValueError(
            f"{fn}: q and k need the same head width H (the last axis): {q_BTNH.shape=}, "
            f"{k_BSNH.shape=}."
        )
    return grouped_heads_attention(
        q_BTNH,
        k_BSNH,
        v_BSNH,
        mask,
        kv_head_axis=2,
        fn=fn,
        scale=scale,
        dropout_rate=dropout_rate,
        dropout_rng=dropout_rng,
        logit_softcap=logit_softcap,
    )


def grouped_heads_attention(
    q_BTNH: jax.Array,
    k: jax.Array,
    v: jax.Array,
    mask: jax.Array | None,
    *,
    kv_head_axis: int,
    scale: float | None = None,
    dropout_rate: float = 0.0,
    dropout_rng: jax.Array | None = None,
    fn: str = "multi_head_attention",
    logit_softcap: float | None = None,
) -> tuple[jax.Array, jax.Array]:
    """The vmaps of `multi_head_attention`, with the K key/value heads on `kv_head_axis`.

    `k` and `v` are `(B, S, K, H)` with `kv_head_axis=2`, or head-major `(B, K, S, H)` (a
    KV cache, read in place) with `kv_head_axis=1`. Query head `i` reads key/value head
    `i // (N // K)`. Returns `(out (B, T, N, Hv), weights (B, N, T, S))`.
    """
    batch, q_len, num_heads, _ = q_BTNH.shape
    if kv_head_axis not in (1, 2) or k.ndim != 4 or v.ndim != 4:
        raise ValueError(f"k and v must be (B, S, K, H) or (B, K, S, H): {k.shape=}, {v.shape=}.")
    seq_axis = 3 - kv_head_axis
    num_kv_heads, kv_len = k.shape[kv_head_axis], k.shape[seq_axis]
    if num_kv_heads < 1 or num_heads % num_kv_heads:
        raise ValueError(
            f"keys have {num_kv_heads} heads, which does not divide the queries' {num_heads}: "
            f"{q_BTNH.shape=}, {k.shape=}; use N key/value heads or a divisor of N."
        )
    group = num_heads // num_kv_heads
    check_dropout(fn, dropout_rate)
    check_logit_softcap(fn, logit_softcap)
    mask = as_dense(mask, q_len, kv_len)
    if mask is not None:
        mask = broadcast_mask(mask, batch, num_heads, q_len, kv_len, fn=fn)
        mask = mask.reshape(batch, num_kv_heads, group, q_len, kv_len)
    keys = None
    if dropout_rng is not None and dropout_rate > 0.0:
        keys = jax.random.split(dropout_rng, (batch, num_heads))
        keys = keys.reshape(batch, num_kv_heads, group)
    q_BTKGH = q_BTNH.reshape(batch, q_len, num_kv_heads, group, q_BTNH.shape[-1])

    def one_head(q_TH, k_SH, v_SH, mask_TS, key):
        return dot_product_attention(
            q_TH,
            k_SH,
            v_SH,
            mask_TS,
            scale=scale,
            dropout_rate=dropout_rate,
            dropout_rng=key,
            logit_softcap=logit_softcap,
        )

    mask_axis, key_axis = (None if mask is None else 0), (None if keys is None else 0)
    # Innermost: the G query heads of one group share their key/value head (in_axes None).
    per_group = jax.vmap(one_head, in_axes=(1, None, None, mask_axis, key_axis), out_axes=(1, 0))
    kv_axis = kv_head_axis - 1  # within one example
    per_kv_head = jax.vmap(
        per_group, in_axes=(1, kv_axis, kv_axis, mask_axis, key_axis), out_axes=(1, 0)
    )
    per_batch = jax.vmap(per_kv_head, in_axes=(0, 0, 0, mask_axis, key_axis), out_axes=(0, 0))
    out_BTKGH, weights_BKGTS = per_batch(q_BTKGH, k, v, mask, keys)
    out_BTNH = out_BTKGH.reshape(batch, q_len, num_heads, out_BTKGH.shape[-1])
    return out_BTNH, weights_BKGTS.reshape(batch, num_heads, q_len, kv_len)


def simple_self_attention(x_TD: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Self-attention with no trainable weights (Raschka ch. 3, section 3.3).

    Every token is query, key and value at once: scores are plain dot products `x x^T`
    (unscaled, as in the notes), normalised by softmax, and the context of token t is the
    weighted sum of all token vectors.

    Args:
      x_TD: token vectors `(T, D)`.

    Returns:
      `(context (T, D), weights (T, T))`.
    """
    x_TD = as_array("simple_self_attention", "x_TD", x_TD)
    _check_rank("x_TD", x_TD, 2)
    check_floating("simple_self_attention", "x_TD", x_TD)
    return dot_product_attention(x_TD, x_TD, x_TD, scale=1.0)
