"""The blocked attention's edges (issue 52): keys no query sees, the causal T == S rule,
float64, and the refusals of its arguments. Its agreement with the reference over masks,
blocks and dropout is in test_attention_impl.py."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flax_transformer import MultiHeadAttention
from flax_transformer.functional import AttentionMask, multi_head_attention
from flax_transformer.functional.blocked_attention import blocked_attention
from flax_transformer.layers.attention_op import attention_op

KEY = jax.random.key(52)
# Six keys, the last two padding, in blocks of four: one block of real keys and one mixed.
VALID = jnp.array([[1, 1, 1, 1, 0, 0]], bool)


def _qkv(q_len=6, kv_len=6, dtype=jnp.float32):
    kq, kk, kv = jax.random.split(KEY, 3)
    shape = (1, kv_len, 2, 8)
    return (
        jax.random.normal(kq, (1, q_len, 2, 8), dtype),
        jax.random.normal(kk, shape, dtype),
        jax.random.normal(kv, shape, dtype),
    )


def _sum(attend):
    def loss(q, k, v):
        out = attend(q, k, v)
        return jnp.sum(out * jnp.sin(jnp.arange(out.size).reshape(out.shape)))

    return jax.value_and_grad(loss, argnums=(0, 1, 2))


@pytest.mark.parametrize("where", ["v", "k", "both"])
@pytest.mark.parametrize("bad", [np.nan, np.inf])
@pytest.mark.parametrize("causal", [False, True])
def test_keys_no_query_sees_never_reach_the_output_or_the_gradients(where, bad, causal):
    """Padded keys and values hold NaN or inf: output and gradients equal those of finite
    padding (issue 52: a zero weight times NaN made all 6 rows NaN)."""
    q, k, v = _qkv()
    poison = lambda x: x.at[:, 4:].set(bad)  # noqa: E731
    k_bad = poison(k) if where in ("k", "both") else k
    v_bad = poison(v) if where in ("v", "both") else v

    def attend(q, k, v):
        return blocked_attention(q, k, v, key_valid_BS=VALID, causal=causal, block=4)

    value, grads = jax.jit(_sum(attend))(q, k_bad, v_bad)
    want_value, want_grads = _sum(attend)(q, k, v)
    mask = AttentionMask(key_valid_BS=VALID, causal=causal)
    reference = multi_head_attention(q, k, v, mask)[0]
    chex.assert_trees_all_close(attend(q, k_bad, v_bad), reference, atol=1e-6)
    np.testing.assert_allclose(value, want_value, rtol=1e-6)
    for grad, want in zip(grads, want_grads, strict=True):
        assert np.isfinite(grad).all()
        # The padded keys' own gradients are 0: they never entered the result.
        chex.assert_trees_all_close(grad, want, atol=1e-6)
    np.testing.assert_array_equal(grads[1][:, 4:], 0.0)
    np.testing.assert_array_equal(grads[2][:, 4:], 0.0)


def test_keys_no_query_sees_through_packed_segments_and_with_dropout():
    """Segment 3 of the keys has no query (packed cross-attention): its NaN values stay out,
    with attention dropout on."""
    q, k, v = _qkv(q_len=4)
    q_seg = jnp.array([[1, 1, 2, 2]])
    kv_seg = jnp.array([[1, 2, 2, 3, 3, 0]])
    v_bad = v.at[:, 3:].set(jnp.nan)
    for rate in (0.0, 0.3):
        out = blocked_attention(
            q, k, v_bad, q_segments_BT=q_seg, kv_segments_BS=kv_seg, block=4,
            dropout_rate=rate, dropout_rng=KEY,
        )  # fmt: skip
        assert np.isfinite(out).all(), rate


def test_cross_attention_with_nan_in_padded_source_rows_stays_finite():
    """`MultiHeadAttention(cross=True, impl='blocked')` over an encoder output whose padded
    rows hold NaN: the result equals the `'xla'` one."""
    x_q = jax.random.normal(KEY, (2, 5, 16))
    x_kv = jax.random.normal(jax.random.fold_in(KEY, 1), (2, 7, 16))
    valid = jnp.arange(7)[None, :] < jnp.array([[4], [7]])
    x_kv_bad = jnp.where(valid[..., None], x_kv, jnp.nan)
    mask = AttentionMask(key_valid_BS=valid)
    layers = {
        impl: MultiHeadAttention(num_heads=2, cross=True, impl=impl) for impl in ("xla", "blocked")
    }
    params = layers["xla"].init(KEY, x_q, x_kv, mask)
    want = layers["xla"].apply(params, x_q, x_kv_bad, mask)
    got = layers["blocked"].apply(params, x_q, x_kv_bad, mask)
    assert np.isfinite(want).all() and np.isfinite(got).all()
    chex.assert_trees_all_close(got, want, atol=1e-5)


@pytest.mark.parametrize("where", ["k", "v"])
@pytest.mark.parametrize("impl", ["xla", "jax_nn", "blocked"])
def test_nan_in_padded_keys_or_values_stays_out_of_every_impl(impl, where):
    """Found beside issue 52: the reference's backward multiplied a padded key's NaN by its
    zero score gradient (dq = dscores @ k), so every query's gradient was NaN though no
    query sees that key; 'jax_nn' let padded NaN values reach every output row too."""
    q, k, v = _qkv()
    mask = AttentionMask(key_valid_BS=VALID)
    attend = lambda q, k, v: attention_op(q, k, v, mask, impl=impl)[0]  # noqa: E731
    poisoned = (k.at[:, 4:].set(jnp.nan), v) if where == "k" else (k, v.at[:, 4:].set(jnp.nan))
    value, grads = _sum(attend)(q, *poisoned)
    want_value, want = _sum(attend)(q, k, v)
    np.testing.assert_allclose(value, want_value, rtol=1e-6)
    for grad, ref in zip(grads, want, strict=True):
        chex.assert_trees_all_close(grad, ref, atol=1e-6)


@pytest.mark.parametrize("q_len, kv_len", [(3, 6), (6, 3)])
def test_causal_with_t_other_than_s_is_refused_as_attention_mask_refuses_it(q_len, kv_len):
    q, k, v = _qkv(q_len, kv_len)
    pattern = rf"causal.*self-attention, T == S; got T={q_len}, S={kv_len}"
    with pytest.raises(ValueError, match=pattern):
        blocked_attention(q, k, v, causal=True)
    with pytest.raises(ValueError, match=pattern):
        AttentionMask(causal=True).dense(q_len, kv_len)
    for impl in ("blocked", "cudnn", "splash"):  # the fused kernels' flag aligned top-left
        with pytest.raises(ValueError, match=pattern):
            attention_op(q, k, v, AttentionMask(causal=True), impl=impl)


def test_float64_inputs_are_computed_in_float64():
    """Issue 52: 1.7e-7 from float64 attention (the float32 error) with a float64 result."""
    with jax.enable_x64(True):
        q, k, v = _qkv(dtype=jnp.float64)
        mask = AttentionMask(key_valid_BS=VALID, causal=True)
        out = blocked_attention(q, k, v, key_valid_BS=VALID, causal=True, block=4)
        want = multi_head_attention(q, k, v, mask)[0]
        assert out.dtype == jnp.float64
        np.testing.assert_allclose(out, want, rtol=1e-13, atol=1e-13)
        value, grads = _sum(
            lambda q, k, v: blocked_attention(q, k, v, key_valid_BS=VALID, causal=True, block=4)
        )(q, k, v)
        want_value, want_grads = _sum(lambda q, k, v: multi_head_attention(q, k, v, mask)[0])(
            q, k, v
        )
        np.testing.assert_allclose(value, want_value, rtol=1e-13)
        for grad, ref in zip(grads, want_grads, strict=True):
            assert grad.dtype == jnp.float64
            np.testing.assert_allclose(grad, ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "kwargs, error, pattern",
    [
        (dict(block=0), ValueError, r"blocked_attention: block=0 must be an int >= 1"),
        (dict(block=-4), ValueError, r"blocked_attention: block=-4 must be an int >= 1"),
        (dict(block=2.5), TypeError, r"blocked_attention: block=2.5 must be an int"),
        (
            dict(dropout_rate=1.0, dropout_rng=KEY),
            ValueError,
            r"blocked_attention: dropout_rate=1.0 must be in \[0, 1\)",
        ),
        # Refused with or without a key, as the reference refuses it.
        (dict(dropout_rate=-0.1), ValueError, r"blocked_attention: dropout_rate=-0.1 must be"),
    ],
)
def test_bad_arguments_are_refused_by_their_own_names(kwargs, error, pattern):
    q, k, v = _qkv()
    with pytest.raises(error, match=pattern):
        blocked_attention(q, k, v, **kwargs)
