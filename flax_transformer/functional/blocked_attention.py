"""Attention over key blocks with an online softmax (the flash algorithm), in `jax.lax`.

The reference (`grouped_heads_attention`) builds the `(B, N, T, S)` scores, softmaxes them
and multiplies by the values: three passes over a `T x S` array that, at long T, lives in
memory rather than cache. Here the keys are cut into blocks of `block` and scanned: each
step scores the queries against one block, keeps a running maximum `m`, a running sum `l`
of `exp(s - m)` and the running weighted values, and rescales them when the maximum grows
(Milakov & Gimelshein 2018; Dao et al. 2022, FlashAttention). The largest array alive is
`(B, N, T, block)`.

The backward pass is written out (`jax.custom_vjp`): the forward keeps only the output and
the log-sum-exp of each query's scores, and the backward recomputes each block's
probabilities from them, so no `T x S` array is kept for the gradient either.

Masks come as their parts (`AttentionMask`: padding keys, causal flag, segment ids), never
dense: each block's mask is built from positions and ids. A query that sees no key gets
zeros (as the reference). A key that no query sees (padding) has its key and value replaced
by zeros in each block before they are multiplied, forward and backward, so NaN or inf
there never reaches the output or a gradient (a zero weight times NaN is NaN). Grouped-query
heads are repeated to N heads first. No weights are returned: `attention_op` runs the
reference when they are asked for.

The scores, the running statistics and the sums are float32 for float32, bfloat16 and
float16 inputs, float64 when an input is float64 (`softmax_dtype`, as the reference). Every
product, forward and backward, follows the mixed-precision policy (`functional.precision`):
its operands in the inputs' dtype (the scaled queries, the probabilities and the
cotangents rounded to it), its sum in float32.

Dropout on the weights (`dropout_rate`, `dropout_rng`) is drawn block by block: block j's
keep mask is `functional.dropout.keep_mask(fold_in(dropout_rng, j), rate, (B, N, T,
block))`, drawn again in the backward pass instead of stored. The softmax normaliser sums
the undropped probabilities, as the reference's dropout after the softmax does; only the
products with the values see the dropped ones. The masks are not the reference's (which
draws per (example, head) key), so the two agree in distribution, not draw for draw.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from flax_transformer.checks.arguments import check_int
from flax_transformer.functional.attention import (
    check_dropout,
    check_logit_softcap,
    softmax_dtype,
)
from flax_transformer.functional.dropout import dropout
from flax_transformer.functional.masks import check_causal_lengths
from flax_transformer.functional.precision import mixed_einsum

# Keys per scan step: scores of a (T, 128) block stay in cache for T up to a few thousand.
DEFAULT_BLOCK = 128


def _block_valid(j, block, kv_len, causal, q_len, key_valid_BS, q_seg_BT, kv_seg_BS):
    """bool `(B or 1, 1, T, block)`: which keys of block j each query may see."""
    pos_K = j * block + jnp.arange(block)
    valid = (pos_K < kv_len)[None, None, None, :]
    if causal:
        valid = valid & (pos_K[None, :] <= jnp.arange(q_len)[:, None])[None, None]
    if key_valid_BS is not None:
        keys_BK = jax.lax.dynamic_slice_in_dim(key_valid_BS, j * block, block, axis=1)
        valid = valid & keys_BK[:, None, None, :]
    if q_seg_BT is not None:
        kv_BK = jax.lax.dynamic_slice_in_dim(kv_seg_BS, j * block, block, axis=1)
        same = (q_seg_BT[:, :, None] == kv_BK[:, None, :]) & (kv_BK[:, None, :] != 0)
        valid = valid & same[:, None]
    return valid


def _seen_only(valid, k_BKNH, v_BKNH):
    """Keys and values of the block with those no query sees (all of `valid`'s T) zeroed:
    selected, not multiplied by a zero weight, so NaN or inf there stays out."""
    seen_BK11 = valid.any(axis=(1, 2))[:, :, None, None]
    zero = jnp.zeros((), k_BKNH.dtype)
    return jnp.where(seen_BK11, k_BKNH, zero), jnp.where(seen_BK11, v_BKNH, zero)


def _padded(x, axis, size):
    pad = size - x.shape[axis]
    if pad == 0:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, pad)
    return jnp.pad(x, widths)


def _blocks(x_BSNH, block):
    """`(B, S, N, H)` -> `(S // block, B, block, N, H)`."""
    b, s, n, h = x_BSNH.shape
    return x_BSNH.reshape(b, s // block, block, n, h).transpose(1, 0, 2, 3, 4)


def _dropped(p_BNTK, j, dropout_key, rate):
    """Block j's probabilities with dropout (kept ones scaled), or as they are at rate 0."""
    if not rate:
        return p_BNTK
    return dropout(p_BNTK, rate, jax.random.fold_in(dropout_key, j))


def _capped(s_BNTK, cap):
    """The scores soft-capped, `cap * tanh(s / cap)` (Gemma 2), or as they are for None."""
    return s_BNTK if cap is None else cap * jnp.tanh(s_BNTK / cap)


def _scores(qs_BTNH, k_BKNH, compute, cap):
    """The scaled queries against one key block, `(B, N, T, block)` in float32, capped."""
    return _capped(mixed_einsum("btnh,bknh->bntk", qs_BTNH, k_BKNH, dtype=compute), cap)


def _forward(q_BTNH, k_BSNH, v_BSNH, masks, dropout_key, causal, block, kv_len, rate, cap):
    q_len = q_BTNH.shape[1]
    dtype = softmax_dtype(q_BTNH.dtype, k_BSNH.dtype, v_BSNH.dtype)
    compute = jnp.result_type(q_BTNH.dtype, k_BSNH.dtype, v_BSNH.dtype)
    scale = 1.0 / math.sqrt(q_BTNH.shape[-1])
    qs_BTNH = q_BTNH.astype(dtype) * scale
    b, _, n, h = q_BTNH.shape
    init = (
        jnp.full((b, n, q_len), -jnp.inf, dtype),  # running max m
        jnp.zeros((b, n, q_len), dtype),  # running sum l
        jnp.zeros((b, n, q_len, v_BSNH.shape[-1]), dtype),  # running values
    )

    def step(carry, xs):
        m_BNT, l_BNT, acc_BNTH = carry
        j, k_BKNH, v_BKNH = xs
        valid = _block_valid(j, block, kv_len, causal, q_len, *masks)
        k_BKNH, v_BKNH = _seen_only(valid, k_BKNH, v_BKNH)
        s_BNTK = _scores(qs_BTNH, k_BKNH, compute, cap)
        s_BNTK = jnp.where(valid, s_BNTK, -jnp.inf)
        new_m = jnp.maximum(m_BNT, s_BNTK.max(-1))
        safe_m = jnp.where(jnp.isfinite(new_m), new_m, 0.0)  # no key seen yet: any shift
        p_BNTK = jnp.exp(s_BNTK - safe_m[..., None])  # exp(-inf) = 0 where masked
        rescale = jnp.exp(m_BNT - safe_m)
        l_BNT = l_BNT * rescale + p_BNTK.sum(-1)
        acc_BNTH = acc_BNTH * rescale[..., None] + mixed_einsum(
            "bntk,bknh->bnth", _dropped(p_BNTK, j, dropout_key, rate), v_BKNH, dtype=compute
        )
        return (new_m, l_BNT, acc_BNTH), None

    num = k_BSNH.shape[1] // block
    xs = (jnp.arange(num), _blocks(k_BSNH, block), _blocks(v_BSNH, block))
    (m_BNT, l_BNT, acc_BNTH), _ = jax.lax.scan(step, init, xs)
    seen = l_BNT > 0
    out_BNTH = jnp.where(seen[..., None], acc_BNTH / jnp.where(seen, l_BNT, 1.0)[..., None], 0.0)
    # log-sum-exp of each query's visible scores; unused (its probabilities are 0) if none.
    lse_BNT = jnp.where(seen, m_BNT + jnp.log(jnp.where(seen, l_BNT, 1.0)), 0.0)
    return out_BNTH.transpose(0, 2, 1, 3).astype(q_BTNH.dtype), lse_BNT


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7, 8, 9))
def _attend(q_BTNH, k_BSNH, v_BSNH, masks, dropout_key, causal, block, kv_len, rate, cap):
    args = (masks, dropout_key, causal, block, kv_len, rate, cap)
    return _forward(q_BTNH, k_BSNH, v_BSNH, *args)[0]


def _attend_fwd(q_BTNH, k_BSNH, v_BSNH, masks, dropout_key, causal, block, kv_len, rate, cap):
    args = (masks, dropout_key, causal, block, kv_len, rate, cap)
    out_BTNH, lse_BNT = _forward(q_BTNH, k_BSNH, v_BSNH, *args)
    return out_BTNH, (q_BTNH, k_BSNH, v_BSNH, masks, dropout_key, out_BTNH, lse_BNT)


def _attend_bwd(causal, block, kv_len, rate, cap, res, dout_BTNH):
    q_BTNH, k_BSNH, v_BSNH, masks, dropout_key, out_BTNH, lse_BNT = res
    q_len = q_BTNH.shape[1]
    dtype = softmax_dtype(q_BTNH.dtype, k_BSNH.dtype, v_BSNH.dtype)
    compute = jnp.result_type(q_BTNH.dtype, k_BSNH.dtype, v_BSNH.dtype)
    scale = 1.0 / math.sqrt(q_BTNH.shape[-1])
    qs_BTNH = q_BTNH.astype(dtype) * scale
    dout_BTNH = dout_BTNH.astype(dtype)
    # D_t = sum_h dout * out = sum_s p_ts dp_ts: the softmax backward's subtracted term
    # (with dropout Z: out = (p Z) v and dp = (dout v^T) Z, so still sum_h dout * out).
    d_BNT = jnp.einsum("btnh,btnh->bnt", dout_BTNH, out_BTNH.astype(dtype))

    def step(dq_BTNH, xs):
        j, k_BKNH, v_BKNH = xs
        valid = _block_valid(j, block, kv_len, causal, q_len, *masks)
        # Zeroed as in the forward pass: dq sums ds * k and dp is dout . v, where a zero
        # ds or p times a NaN key or value would be NaN.
        k_BKNH, v_BKNH = _seen_only(valid, k_BKNH, v_BKNH)
        s_BNTK = _scores(qs_BTNH, k_BKNH, compute, cap)
        p_BNTK = jnp.where(valid, jnp.exp(s_BNTK - lse_BNT[..., None]), 0.0)
        pz_BNTK = _dropped(p_BNTK, j, dropout_key, rate)
        dv_BKNH = mixed_einsum("bntk,btnh->bknh", pz_BNTK, dout_BTNH, dtype=compute)
        dpz_BNTK = mixed_einsum("btnh,bknh->bntk", dout_BTNH, v_BKNH, dtype=compute)
        # p * dp with dp = dpz * Z: the dropped probabilities times dpz.
        ds_BNTK = pz_BNTK * dpz_BNTK - p_BNTK * d_BNT[..., None]
        if cap is not None:  # d(c tanh(x / c))/dx = 1 - tanh^2 = 1 - (capped / c)^2
            ds_BNTK = ds_BNTK * (1.0 - jnp.square(s_BNTK / cap))
        dq_BTNH = dq_BTNH + mixed_einsum("bntk,bknh->btnh", ds_BNTK, k_BKNH, dtype=compute) * scale
        dk_BKNH = mixed_einsum("bntk,btnh->bknh", ds_BNTK, qs_BTNH, dtype=compute)
        return dq_BTNH, (dk_BKNH, dv_BKNH)

    num = k_BSNH.shape[1] // block
    xs = (jnp.arange(num), _blocks(k_BSNH, block), _blocks(v_BSNH, block))
    dq_BTNH, (dk_NBKNH, dv_NBKNH) = jax.lax.scan(step, jnp.zeros_like(qs_BTNH), xs)

    def unblock(x, like):
        nb, b, k, n, h = x.shape
        return x.transpose(1, 0, 2, 3, 4).reshape(b, nb * k, n, h).astype(like.dtype)

    mask_cotangents = jax.tree.map(lambda _: None, masks)
    return (
        dq_BTNH.astype(q_BTNH.dtype),
        unblock(dk_NBKNH, k_BSNH),
        unblock(dv_NBKNH, v_BSNH),
        mask_cotangents,
        None,  # the dropout key
    )


_attend.defvjp(_attend_fwd, _attend_bwd)


def blocked_attention(
    q_BTNH: jax.Array,
    k_BSKH: jax.Array,
    v_BSKH: jax.Array,
    *,
    key_valid_BS: jax.Array | None = None,
    q_segments_BT: jax.Array | None = None,
    kv_segments_BS: jax.Array | None = None,
    causal: bool = False,
    block: int = DEFAULT_BLOCK,
    dropout_rate: float = 0.0,
    dropout_rng: jax.Array | None = None,
    logit_softcap: float | None = None,
) -> jax.Array:
    """Scaled dot-product attention of every head, key block by key block.

    The result equals `grouped_heads_attention` with the mask `AttentionMask(key_valid_BS,
    q_segments_BT, kv_segments_BS, causal).dense(T, S)` (to float32 rounding), gradients
    included.

    Args:
      q_BTNH: queries `(B, T, N, H)`, unscaled.
      k_BSKH, v_BSKH: keys and values `(B, S, K, H)`, K dividing N.
      key_valid_BS: bool `(B, S)`, True for real keys; None: all.
      q_segments_BT, kv_segments_BS: int segment ids (0 = padding), both or neither.
      causal: query t sees keys s <= t only; self-attention, T == S (ValueError
        otherwise, as `AttentionMask.dense`).
      block: keys per scan step, an int >= 1 (S is padded up to a multiple of it, the
        padding masked).
      dropout_rate, dropout_rng: dropout on the attention weights, the rate in [0, 1) (to
        2**-16, see `functional.dropout`), drawn per key block (module docstring); off when
        the key is None or the rate 0.
      logit_softcap: Gemma 2's attention-logit soft-capping, `c * tanh(scores / c)` on the
        scaled scores before the mask (in the backward pass too); a finite number > 0, or
        None (off).

    Returns:
      `(B, T, N, H)` in the queries' dtype, computed in float32 (float64 if an input is
      float64); zeros for a query that sees no key. A key that no query sees never reaches
      the output or the gradients, whatever its key and value hold (NaN, inf).

    Raises:
      ValueError: K does not divide N; segment ids not both or neither; `causal` with
        T != S; `block` < 1; `dropout_rate` outside [0, 1); `logit_softcap` not None or a
        finite number > 0. TypeError: `block` not an int.
    """
    fn = "blocked_attention"
    check_int(fn, "block", block, low=1, what=f">= 1 (keys per scan step; {DEFAULT_BLOCK} default)")
    check_dropout(fn, dropout_rate)
    check_logit_softcap(fn, logit_softcap)
    cap = None if logit_softcap is None else float(logit_softcap)
    if causal:
        check_causal_lengths(f"{fn}: causal=True", q_BTNH.shape[1], k_BSKH.shape[1])
    heads, kv_heads = q_BTNH.shape[2], k_BSKH.shape[2]
    if heads % kv_heads:
        raise ValueError(
            f"blocked_attention: {kv_heads} key/value heads do not divide {heads} query "
            f"heads ({q_BTNH.shape=}, {k_BSKH.shape=})."
        )
    if (q_segments_BT is None) != (kv_segments_BS is None):
        raise ValueError(
            "blocked_attention needs both q_segments_BT and kv_segments_BS, or neither."
        )
    if kv_heads != heads:
        k_BSKH, v_BSKH = (jnp.repeat(x, heads // kv_heads, axis=2) for x in (k_BSKH, v_BSKH))
    kv_len = k_BSKH.shape[1]
    block = min(block, kv_len)
    padded = -(-kv_len // block) * block
    k_BSNH, v_BSNH = (_padded(x, 1, padded) for x in (k_BSKH, v_BSKH))
    masks = (
        None if key_valid_BS is None else _padded(jnp.asarray(key_valid_BS, bool), 1, padded),
        q_segments_BT,
        None if kv_segments_BS is None else _padded(kv_segments_BS, 1, padded),
    )
    rate = float(dropout_rate) if dropout_rng is not None else 0.0
    if dropout_rng is None:
        dropout_rng = jax.random.key(0)  # unused at rate 0
    elif not jnp.issubdtype(jnp.asarray(dropout_rng).dtype, jax.dtypes.prng_key):
        dropout_rng = jax.random.wrap_key_data(dropout_rng)  # a raw uint32 key
    args = (masks, dropout_rng, causal, block, kv_len, rate, cap)
    return _attend(q_BTNH, k_BSNH, v_BSNH, *args)


__all__ = ["DEFAULT_BLOCK", "blocked_attention"]
