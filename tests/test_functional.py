"""Unit and property tests of the pure functional core (`flax_transformer.functional`).

Each function runs both eagerly and under `jax.jit` (`chex.variants`), and is compared with an
independent reference: `jax.nn.dot_product_attention`, `flax.linen.LayerNorm`, or numpy.
"""

from __future__ import annotations

import functools
import math
import re

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized
from jax.test_util import check_grads

from flax_transformer.functional import (
    causal_mask,
    combine_masks,
    dot_product_attention,
    feed_forward,
    gelu,
    gelu_tanh,
    layer_norm,
    multi_head_attention,
    padding_mask,
    project,
    rms_norm,
    simple_self_attention,
    sinusoidal_positions,
)

# float32 against float32/float64 references.
TOL = dict(rtol=1e-5, atol=1e-5)
# bf16 has an 8-bit mantissa: relative error ~2^-8 per rounding.
BF16_TOL = dict(rtol=3e-2, atol=3e-2)


def _normal(seed: int, shape, dtype=np.float32) -> np.ndarray:
    # Host-side numpy inputs keep the suite fast: with jax.random, every new shape compiles a
    # threefry kernel (~0.5 s each on CPU), and eager jnp edits compile one op at a time.
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _qkv(seed: int, b=2, t=5, s=7, n=3, h=4, hv=6, dtype=np.float32):
    return (
        _normal(seed, (b, t, n, h), dtype),
        _normal(seed + 100, (b, s, n, h), dtype),
        _normal(seed + 200, (b, s, n, hv), dtype),
    )


def _random_mask(seed: int, shape, p_visible=0.6, every_row_visible=True) -> np.ndarray:
    """Random bool mask; optionally forces one random visible key per query row."""
    rng = np.random.default_rng(seed)
    mask = rng.uniform(size=shape) < p_visible
    if every_row_visible:
        rows = mask.reshape(-1, shape[-1])
        rows[np.arange(rows.shape[0]), rng.integers(0, shape[-1], rows.shape[0])] = True
    return mask


# jit once per shape rather than compiling jax.nn's ops one by one in eager mode.
_jax_nn_attention = jax.jit(jax.nn.dot_product_attention, static_argnames="is_causal")


def _softmax64(x, axis=-1):
    x = np.asarray(x, np.float64)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


class MultiHeadAttentionTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.named_parameters(
        ("no_mask", "none", 5, 7),
        ("random_bool_B1TS", "random", 5, 7),
        ("causal", "causal", 6, 6),
        ("causal_and_random", "causal_random", 6, 6),
    )
    def test_matches_jax_nn(self, mask_kind, t, s):
        q, k, v = _qkv(0, t=t, s=s, hv=4)  # jax.nn needs the value width equal to H
        is_causal = mask_kind.startswith("causal")
        mask = None
        if "random" in mask_kind:
            mask = _random_mask(1, (2, 1, t, s))
            if is_causal:  # keep the diagonal visible so no row is empty
                mask = mask | np.eye(t, dtype=bool)
        ours_mask = combine_masks(mask, causal_mask(t) if is_causal else None)

        fn = self.variant(multi_head_attention)
        out, weights = fn(q, k, v, ours_mask) if ours_mask is not None else fn(q, k, v)
        chex.assert_shape(out, (2, t, 3, 4))
        chex.assert_shape(weights, (2, 3, t, s))
        chex.assert_type(weights, jnp.float32)

        ref = _jax_nn_attention(q, k, v, mask=mask, is_causal=is_causal)
        np.testing.assert_allclose(out, ref, **TOL)
        # Weights against a float64 softmax of the masked scores.
        scores = np.einsum("btnh,bsnh->bnts", np.asarray(q, np.float64), np.asarray(k, np.float64))
        visible = np.ones((2, 3, t, s), bool) if ours_mask is None else np.asarray(ours_mask)
        visible = np.broadcast_to(visible, scores.shape)
        expected = _softmax64(np.where(visible, scores / math.sqrt(4), -np.inf))
        np.testing.assert_allclose(weights, expected, **TOL)

    @chex.variants(with_jit=True, without_jit=True)
    def test_weight_rows_sum_to_one_or_zero(self):
        q, k, v = _qkv(2)
        mask = _random_mask(3, (2, 3, 5, 7), p_visible=0.3, every_row_visible=False)
        mask[0, 1, 2] = False  # at least one empty row for sure
        _, weights = self.variant(multi_head_attention)(q, k, v, mask)
        sums = np.asarray(weights).sum(-1)
        any_visible = np.asarray(mask).any(-1)
        np.testing.assert_allclose(sums[any_visible], 1.0, rtol=1e-6)
        np.testing.assert_array_equal(sums[~any_visible], 0.0)
        np.testing.assert_array_equal(np.asarray(weights)[~np.asarray(mask)], 0.0)

    @chex.variants(with_jit=True, without_jit=True)
    def test_padded_keys_get_exactly_zero_weight(self):
        q, k, v = _qkv(4, s=6)
        tokens = np.array([[5, 3, 8, 0, 0, 0], [7, 1, 2, 9, 4, 0]])
        # Huge scores on the padded keys: they must still get exactly 0, not just ~0.
        k[0, 3:], k[1, 5:] = 100.0, 100.0
        mask = padding_mask(tokens, pad_id=0)
        chex.assert_shape(mask, (2, 1, 1, 6))
        out, weights = self.variant(multi_head_attention)(q, k, v, mask)
        chex.assert_shape(out, (2, 5, 3, 6))
        weights = np.asarray(weights)
        assert np.all(weights[0, ..., 3:] == 0.0)
        assert np.all(weights[1, ..., 5:] == 0.0)
        np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-6)
        # The padded values do not leak into the output.
        v[0, 3:] = 1e6
        out2, _ = self.variant(multi_head_attention)(q, k, v, mask)
        np.testing.assert_array_equal(out2[0], out[0])

    def test_heads_drop_independently(self):
        q, k, v = _qkv(5, b=1, n=2)
        q, k, v = (np.repeat(a[:, :, :1], 2, axis=2) for a in (q, k, v))  # identical heads
        fn = jax.jit(functools.partial(multi_head_attention, dropout_rate=0.5))
        out, _ = fn(q, k, v, dropout_rng=jax.random.key(0))
        assert not np.allclose(out[:, :, 0], out[:, :, 1])

    def test_mask_that_does_not_broadcast_raises(self):
        q, k, v = _qkv(6)
        with self.assertRaisesRegex(ValueError, r"mask\.shape=\(2, 1, 5, 6\)"):
            multi_head_attention(q, k, v, np.ones((2, 1, 5, 6), bool))

    @parameterized.named_parameters(
        ("rank1", (7,)), ("rank3", (2, 5, 7)), ("rank5", (1, 2, 1, 5, 7))
    )
    def test_mask_of_rank_other_than_2_or_4_raises(self, shape):
        """A (B, T, S) mask would broadcast its batch axis against the heads: refused."""
        q, k, v = _qkv(6, b=3, n=3)
        pattern = rf"mask\.shape={re.escape(str(shape))} has rank {len(shape)}.*rank 2.*rank 4"
        with self.assertRaisesRegex(ValueError, pattern):
            multi_head_attention(q, k, v, np.ones(shape, bool))

    def test_rank3_error_says_how_to_fix_it(self):
        q, k, v = _qkv(6, b=3, n=3)
        with self.assertRaisesRegex(ValueError, r"heads N, not the batch B.*mask\[:, None\]"):
            multi_head_attention(q, k, v, np.ones((3, 5, 7), bool))

    def test_rank_errors_name_the_shape(self):
        q, k, v = _qkv(6)
        with self.assertRaisesRegex(ValueError, r"q_BTNH\.shape=\(2, 5, 3\)"):
            multi_head_attention(q[..., 0], k, v)
        with self.assertRaisesRegex(ValueError, "k_BSNH.shape"):
            multi_head_attention(q, k[0], v)
        with self.assertRaisesRegex(ValueError, r"k_BSNH\.shape=\(1, 7, 3, 4\)"):
            multi_head_attention(q, k[:1], v[:1])


def _single_qkv(seed: int, t=5, s=6, h=8, hv=8, dtype=np.float32):
    # One set of shapes for most single-head tests, so eager mode reuses its compiled ops.
    return (
        _normal(seed, (t, h), dtype),
        _normal(seed + 1, (s, h), dtype),
        _normal(seed + 2, (s, hv), dtype),
    )


def _attention_loss(q, k, v, mask):
    out, weights = dot_product_attention(q, k, v, mask)
    return jnp.sum(out**2) + jnp.sum(weights**2)


# Gradients are checked under jit only: eager autodiff compiles every primitive separately.
_attention_grads = jax.jit(jax.grad(_attention_loss, argnums=(0, 1, 2)))


class DotProductAttentionTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_fully_masked_row_is_zero_with_finite_grads(self):
        q, k, v = _single_qkv(0)
        mask = np.ones((5, 6), bool)
        mask[1] = False

        out, weights = self.variant(dot_product_attention)(q, k, v, mask)
        chex.assert_tree_all_finite((out, weights))
        np.testing.assert_array_equal(weights[1], 0.0)
        np.testing.assert_array_equal(out[1], 0.0)
        np.testing.assert_allclose(np.asarray(weights).sum(-1)[[0, 2, 3, 4]], 1.0, rtol=1e-6)

        grads = _attention_grads(q, k, v, mask)
        chex.assert_tree_all_finite(grads)
        np.testing.assert_array_equal(grads[0][1], 0.0)  # the empty row's query has no effect
        # Nothing visible anywhere: still zeros, still finite.
        nothing = np.zeros((5, 6), bool)
        chex.assert_tree_all_finite(_attention_grads(q, k, v, nothing))
        out, weights = self.variant(dot_product_attention)(q, k, v, nothing)
        np.testing.assert_array_equal(out, 0.0)
        np.testing.assert_array_equal(weights, 0.0)

    @chex.variants(with_jit=True, without_jit=True)
    def test_bf16_gives_float32_weights_and_bf16_output(self):
        q, k, v = _single_qkv(3)
        mask = np.tril(np.ones((5, 6), bool), 1)
        out32, w32 = self.variant(dot_product_attention)(q, k, v, mask)
        bf16 = [a.astype(jnp.bfloat16) for a in (q, k, v)]
        out, weights = self.variant(dot_product_attention)(*bf16, mask)
        chex.assert_type(out, jnp.bfloat16)
        chex.assert_type(weights, jnp.float32)
        chex.assert_shape((out, weights), [(5, 8), (5, 6)])
        np.testing.assert_allclose(weights, w32, **BF16_TOL)
        np.testing.assert_allclose(np.asarray(out, np.float32), out32, **BF16_TOL)
        np.testing.assert_allclose(np.asarray(weights).sum(-1), 1.0, rtol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_scale_none_is_inverse_sqrt_dk(self):
        q, k, v = _single_qkv(6)
        default = self.variant(dot_product_attention)(q, k, v)
        explicit = self.variant(functools.partial(dot_product_attention, scale=8**-0.5))(q, k, v)
        chex.assert_trees_all_close(default, explicit, rtol=1e-6, atol=1e-7)
        unscaled = self.variant(functools.partial(dot_product_attention, scale=1.0))(q, k, v)
        assert not np.allclose(unscaled[1], default[1])

    @chex.variants(with_jit=True, without_jit=True)
    def test_dropout(self):
        q, k, _ = _single_qkv(9)
        eye = np.eye(6, dtype=np.float32)  # V = I makes the output the weights actually used
        rate = 0.5
        base, w = self.variant(dot_product_attention)(q, k, eye)

        key = jax.random.key(42)
        no_rate = self.variant(functools.partial(dot_product_attention, dropout_rate=0.0))
        chex.assert_trees_all_close(no_rate(q, k, eye, dropout_rng=key), (base, w))
        no_rng = self.variant(functools.partial(dot_product_attention, dropout_rate=rate))
        chex.assert_trees_all_close(no_rng(q, k, eye), (base, w))

        dropped = self.variant(functools.partial(dot_product_attention, dropout_rate=rate))
        out_a, w_a = dropped(q, k, eye, dropout_rng=key)
        out_b, _ = dropped(q, k, eye, dropout_rng=key)
        out_c, _ = dropped(q, k, eye, dropout_rng=jax.random.key(7))
        chex.assert_trees_all_equal(out_a, out_b)  # deterministic per key
        assert not np.allclose(out_a, base)
        assert not np.allclose(out_a, out_c)
        chex.assert_trees_all_close(w_a, w)  # returned weights are the ones before dropout
        # Each used weight is either dropped or rescaled by 1 / (1 - rate).
        out_a, w = np.asarray(out_a), np.asarray(w)
        kept = out_a != 0.0
        assert 0 < kept.sum() < kept.size
        np.testing.assert_allclose(out_a[kept], w[kept] / (1.0 - rate), rtol=1e-6)

    def test_simple_self_attention_is_unscaled_self_attention(self):
        x = _normal(0, (6, 8))
        chex.assert_trees_all_close(
            simple_self_attention(x), dot_product_attention(x, x, x, scale=1.0)
        )
        with self.assertRaisesRegex(ValueError, r"x_TD\.shape=\(2, 3, 4\)"):
            simple_self_attention(np.ones((2, 3, 4)))

    def test_mask_must_be_rank2(self):
        q, k, v = _single_qkv(12)
        keys = np.array([1, 1, 0, 1, 0, 1], bool)
        _, weights = dot_product_attention(q, k, v, keys[None, :])  # (1, S): a key mask
        np.testing.assert_array_equal(np.asarray(weights)[:, ~keys], 0.0)
        for shape in [(6,), (1, 5, 6)]:
            with self.assertRaisesRegex(ValueError, r"mask must have rank 2, \(T, S\)"):
                dot_product_attention(q, k, v, np.ones(shape, bool))
        with self.assertRaisesRegex(ValueError, r"does not broadcast to \(T, S\)=\(5, 6\)"):
            dot_product_attention(q, k, v, np.ones((5, 4), bool))

    @parameterized.named_parameters(
        ("q_rank3", (1, 3, 4), (5, 4), (5, 6), r"q\.shape=\(1, 3, 4\)"),
        ("k_rank1", (3, 4), (4,), (5, 6), r"k\.shape=\(4,\)"),
        ("v_rank3", (3, 4), (5, 4), (1, 5, 6), r"v\.shape=\(1, 5, 6\)"),
        ("dk_mismatch", (3, 4), (5, 2), (5, 6), r"q\.shape=\(3, 4\), k\.shape=\(5, 2\)"),
        ("len_mismatch", (3, 4), (5, 4), (6, 6), r"k\.shape=\(5, 4\), v\.shape=\(6, 6\)"),
    )
    def test_shape_errors_name_the_shape(self, q_shape, k_shape, v_shape, pattern):
        q, k, v = np.ones(q_shape), np.ones(k_shape), np.ones(v_shape)
        with self.assertRaisesRegex(ValueError, pattern):
            dot_product_attention(q, k, v)


def _enable_x64():
    """`jax_enable_x64` as a context manager, in this jax (`jax.enable_x64`) or an older one."""
    if hasattr(jax, "enable_x64"):
        return jax.enable_x64(True)
    from jax.experimental import enable_x64

    return enable_x64()


class Float64Test(chex.TestCase):
    """Softmax in float32 *or wider*: float64 inputs stay float64, so gradients check."""

    @pytest.mark.slow  # numerical gradients in float64
    def test_float64_keeps_float64_and_gradients_check(self):
        q, k, v = _qkv(13, dtype=np.float64)
        mask = _random_mask(14, (2, 1, 5, 7))
        with _enable_x64():
            q, k, v = (jnp.asarray(a, jnp.float64) for a in (q, k, v))
            out, weights = multi_head_attention(q, k, v, mask)
            chex.assert_type([out, weights], jnp.float64)

            def f(q, k, v):
                out, weights = multi_head_attention(q, k, v, mask)
                return jnp.sum(out * jnp.cos(out)) + jnp.sum(weights**2)

            check_grads(jax.jit(f), (q, k, v), order=2, modes=["rev"])
            single = lambda q, k, v: dot_product_attention(q, k, v, causal_mask(5))
            check_grads(jax.jit(single), (q[0, :, 0], k[0, :5, 0], v[0, :5, 0]), 1)

    def test_norms_keep_float64_statistics_for_float64_inputs(self):
        """layer_norm and rms_norm of float64 inputs agree with a float64 numpy reference to
        float64 rounding (computed in float32 they were off by ~1e-7 relative)."""
        rng = np.random.default_rng(0)
        # A large common offset: float32 statistics lose the small variations around it.
        x = 1000.0 + rng.normal(size=(3, 16))
        scale, bias = rng.normal(size=16), rng.normal(size=16)
        eps = 1e-5
        centred = x - x.mean(-1, keepdims=True)
        want_ln = centred / np.sqrt((centred**2).mean(-1, keepdims=True) + eps) * scale + bias
        want_rms = x / np.sqrt((x**2).mean(-1, keepdims=True) + eps) * scale
        with _enable_x64():
            args = [jnp.asarray(a, jnp.float64) for a in (x, scale, bias)]
            for fn in (lambda *a: layer_norm(*a, eps), jax.jit(lambda *a: layer_norm(*a, eps))):
                got = fn(*args)
                chex.assert_type(got, jnp.float64)
                np.testing.assert_allclose(got, want_ln, rtol=1e-10, atol=1e-10)
            got = rms_norm(args[0], args[1], eps)
            chex.assert_type(got, jnp.float64)
            np.testing.assert_allclose(got, want_rms, rtol=1e-12, atol=1e-12)
            # float32 and bfloat16 inputs still compute their statistics in float32.
            x32 = jnp.asarray(rng.normal(size=(2, 16)), jnp.float32)
            chex.assert_type(rms_norm(x32, None), jnp.float32)
            bf = layer_norm(x32.astype(jnp.bfloat16), None, None)
            ref = layer_norm(x32.astype(jnp.bfloat16).astype(jnp.float32), None, None)
            np.testing.assert_array_equal(bf, ref.astype(jnp.bfloat16))


class MasksTest(chex.TestCase):
    @parameterized.parameters(1, 2, 5)
    def test_causal_mask(self, length):
        mask = causal_mask(length)
        chex.assert_shape(mask, (length, length))
        chex.assert_type(mask, jnp.bool_)
        np.testing.assert_array_equal(mask, np.tril(np.ones((length, length), bool)))

    @parameterized.parameters(0, -3, 2.5, "4", None)
    def test_causal_mask_bad_length(self, length):
        with self.assertRaisesRegex(ValueError, "positive int length"):
            causal_mask(length)

    def test_padding_mask(self):
        tokens = jnp.array([[4, 9, 0, 0], [3, 3, 3, 0]])
        mask = padding_mask(tokens)
        chex.assert_type(mask, jnp.bool_)
        np.testing.assert_array_equal(mask[:, 0, 0], [[1, 1, 0, 0], [1, 1, 1, 0]])
        chex.assert_shape(mask, (2, 1, 1, 4))
        chex.assert_shape(padding_mask(tokens[0]), (1, 4))  # one sequence: a (T, S) key mask
        np.testing.assert_array_equal(padding_mask(tokens, pad_id=3)[1, 0, 0], [0, 0, 0, 1])
        with self.assertRaisesRegex(
            ValueError, r"\(B, S\) or \(S,\), got tokens.shape=\(1, 2, 4\)"
        ):
            padding_mask(tokens[None])

    def test_combine_masks(self):
        assert combine_masks() is None
        assert combine_masks(None, None) is None
        pad = padding_mask(jnp.array([[4, 9, 0], [3, 0, 0]]))  # (2, 1, 1, 3)
        chex.assert_trees_all_equal(combine_masks(None, pad, None), pad)
        both = combine_masks(pad, None, causal_mask(3))
        chex.assert_shape(both, (2, 1, 3, 3))  # (B, N=1, T, S): the batch stays on axis 0
        chex.assert_type(both, jnp.bool_)
        np.testing.assert_array_equal(both, np.asarray(pad) & np.tril(np.ones((3, 3), bool)))
        # Masks are bool: an int (or additive float) mask is refused with the conversion.
        with pytest.raises(TypeError, match=r"masks\[0\] has dtype int32.*m.astype\(bool\)"):
            combine_masks(jnp.array([[1, 0], [2, 1]]))


def _flax_layer_norm(x, scale, bias, eps):
    module = nn.LayerNorm(epsilon=eps)
    shapes = jax.eval_shape(module.init, jax.random.key(0), x)["params"]
    chex.assert_trees_all_equal_shapes(shapes, {"scale": scale, "bias": bias})
    return jax.jit(module.apply)({"params": {"scale": scale, "bias": bias}}, x)


class LayerNormTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.parameters(1e-5, 1e-2)
    def test_matches_flax_layer_norm(self, eps):
        x = _normal(0, (2, 3, 16)) * 2.0 + 0.5
        scale, bias = _normal(1, (16,)), _normal(2, (16,))
        out = self.variant(functools.partial(layer_norm, eps=eps))(x, scale, bias)
        chex.assert_shape(out, x.shape)
        np.testing.assert_allclose(out, _flax_layer_norm(x, scale, bias, eps), **TOL)

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.parameters(True, False)
    def test_matches_numpy(self, eps_inside_sqrt):
        eps = 1e-3
        x = _normal(3, (4, 10)) * 3.0
        scale, bias = _normal(4, (10,)), _normal(5, (10,))
        fn = functools.partial(layer_norm, eps=eps, eps_inside_sqrt=eps_inside_sqrt)
        out = self.variant(fn)(x, scale, bias)
        x64 = np.asarray(x, np.float64)
        centred = x64 - x64.mean(-1, keepdims=True)
        var = (centred**2).mean(-1, keepdims=True)  # biased
        denom = np.sqrt(var + eps) if eps_inside_sqrt else np.sqrt(var) + eps
        expected = centred / denom * np.asarray(scale) + np.asarray(bias)
        np.testing.assert_allclose(out, expected, **TOL)

    @chex.variants(with_jit=True, without_jit=True)
    def test_none_scale_and_bias_and_constant_rows(self):
        x = _normal(6, (3, 8))
        x[1] = 7.0  # a constant row: zero variance
        out = self.variant(layer_norm)(x, None, None)
        ones = self.variant(layer_norm)(x, np.ones(8, np.float32), np.zeros(8, np.float32))
        chex.assert_trees_all_close(out, ones)
        chex.assert_tree_all_finite(out)
        np.testing.assert_array_equal(out[1], 0.0)
        np.testing.assert_allclose(out[0].mean(), 0.0, atol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_bf16_in_bf16_out(self):
        x = (_normal(7, (4, 32)) * 10.0 + 100.0).astype(jnp.bfloat16)
        scale = jnp.ones((32,), jnp.float32)
        out = self.variant(layer_norm)(x, scale, None)
        chex.assert_type(out, jnp.bfloat16)
        chex.assert_shape(out, (4, 32))
        # Statistics in float32: the result matches normalising the same values in float32.
        ref = layer_norm(x.astype(jnp.float32), scale, None)
        np.testing.assert_allclose(np.asarray(out, np.float32), ref, **BF16_TOL)


def _loop_positions(length, dim, base):
    table = np.zeros((length, dim))
    for pos in range(length):
        for i in range(dim // 2):
            angle = pos / base ** (2 * i / dim)
            table[pos, 2 * i] = math.sin(angle)
            table[pos, 2 * i + 1] = math.cos(angle)
    return table


class PositionsTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_matches_loop(self):
        table = self.variant(functools.partial(sinusoidal_positions, 7, 6))()
        chex.assert_shape(table, (7, 6))
        chex.assert_type(table, jnp.float32)
        np.testing.assert_allclose(table, _loop_positions(7, 6, 10000.0), atol=1e-6)

    @parameterized.parameters((1, 2, 10000.0), (50, 16, 10000.0), (9, 4, 100.0), (3, 8, 2.5))
    def test_matches_loop_sizes(self, length, dim, base):
        table = jax.jit(sinusoidal_positions, static_argnums=(0, 1, 2))(length, dim, base)
        chex.assert_shape(table, (length, dim))
        # float32 angles up to 49 rad: ~1e-5 absolute error in sin/cos.
        np.testing.assert_allclose(table, _loop_positions(length, dim, base), atol=2e-5)

    @parameterized.parameters((4, 5), (4, 1), (4, 0), (0, 4))
    def test_bad_sizes_raise(self, length, dim):
        with self.assertRaises(ValueError):
            sinusoidal_positions(length, dim)

    def test_odd_dim_message(self):
        with self.assertRaisesRegex(ValueError, "even dim.*got 7"):
            sinusoidal_positions(3, 7)
        with self.assertRaisesRegex(ValueError, "base=0.0 must be > 0"):
            sinusoidal_positions(3, 4, base=0.0)


class FeedForwardTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_matches_numpy(self):
        self._check(self.variant(feed_forward), jax.nn.relu, use_bias=True)

    @parameterized.named_parameters(
        ("relu_no_bias", jax.nn.relu, False), ("gelu_bias", jax.nn.gelu, True)
    )
    def test_matches_numpy_variations(self, activation, use_bias):
        fn = jax.jit(feed_forward, static_argnames="activation")
        self._check(functools.partial(fn, activation=activation), activation, use_bias)

    def _check(self, fn, activation, use_bias):
        x = _normal(0, (2, 3, 8))
        w1, w2 = _normal(1, (8, 32)) / 3.0, _normal(2, (32, 8)) / 6.0
        b1, b2 = (_normal(3, (32,)), _normal(4, (8,))) if use_bias else (None, None)
        out = fn(x, w1, b1, w2, b2)
        chex.assert_shape(out, (2, 3, 8))

        x64, w1_64, w2_64 = (np.asarray(a, np.float64) for a in (x, w1, w2))
        h = x64 @ w1_64 + (np.asarray(b1, np.float64) if use_bias else 0.0)
        if activation is jax.nn.relu:
            h = np.maximum(h, 0.0)
        else:
            # jax.nn.gelu's default tanh approximation (Hendrycks & Gimpel 2016).
            h = 0.5 * h * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * h**3)))
        expected = h @ w2_64 + (np.asarray(b2, np.float64) if use_bias else 0.0)
        np.testing.assert_allclose(out, expected, **TOL)


class GeluTest(chex.TestCase):
    def test_equals_the_exact_gelu_in_float64_with_its_gradient(self):
        # x * Phi(x) with Phi the normal CDF (Hendrycks & Gimpel 2016, eq. 1), from math.erf.
        x = np.concatenate([np.linspace(-12.0, 12.0, 4001), _normal(0, (1000,)) * 3.0])
        x = x.astype(np.float32)
        x64 = x.astype(np.float64)
        erf = np.vectorize(math.erf)
        cdf = 0.5 * (1.0 + erf(x64 / math.sqrt(2.0)))
        pdf = np.exp(-0.5 * x64**2) / math.sqrt(2.0 * math.pi)
        out = jax.jit(gelu)(x)
        grad = jax.jit(jax.vmap(jax.grad(gelu)))(x)
        self.assertEqual(out.dtype, jnp.float32)
        np.testing.assert_allclose(out, x64 * cdf, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(grad, cdf + x64 * pdf, rtol=1e-6, atol=1e-6)
        # The same function as jax.nn.gelu's exact form, to float32 rounding.
        np.testing.assert_allclose(out, jax.nn.gelu(x, approximate=False), atol=2e-6)

    def test_keeps_bfloat16(self):
        out = gelu(jnp.linspace(-3, 3, 7, dtype=jnp.bfloat16))
        self.assertEqual(out.dtype, jnp.bfloat16)

    @parameterized.named_parameters(
        # Unit roundoff of the dtype (8 and 11 significant bits), plus float32's own error
        # where |gelu| > 1e-2 (2.6e-5 relative, at x = -2.67).
        ("gelu_bfloat16", "gelu", jnp.bfloat16, 2.0**-8 + 3e-5),
        ("gelu_float16", "gelu", jnp.float16, 2.0**-11 + 3e-5),
        ("gelu_tanh_bfloat16", "gelu_tanh", jnp.bfloat16, 2.0**-8 + 3e-5),
        ("gelu_tanh_float16", "gelu_tanh", jnp.float16, 2.0**-11 + 3e-5),
    )
    def test_low_precision_is_one_rounding_of_the_exact_value(self, name, dtype, bound):
        """Issue 52: `1 + erf(x / sqrt 2)` computed in bfloat16 cancelled, 18.2% off at
        x = -2.58 (-0.01514 against -0.01281); the same for the tanh form. Computed in
        float32 and rounded once, every value with |gelu| > 1e-2 over [-6, 6] is within
        the dtype's unit roundoff (torch's bfloat16 GELU: 0.38%)."""
        x = jnp.linspace(-6.0, 6.0, 20001).astype(dtype)
        x64 = np.asarray(x.astype(jnp.float32), np.float64)
        if name == "gelu":
            want = x64 * 0.5 * (1.0 + np.vectorize(math.erf)(x64 / math.sqrt(2.0)))
        else:
            want = 0.5 * x64 * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x64 + 0.044715 * x64**3)))
        fn = {"gelu": gelu, "gelu_tanh": gelu_tanh}[name]
        for out in (fn(x), jax.jit(fn)(x)):
            self.assertEqual(out.dtype, dtype)
            got = np.asarray(out.astype(jnp.float32), np.float64)
            big = np.abs(want) > 1e-2
            worst = np.max(np.abs(got - want)[big] / np.abs(want[big]))
            self.assertLessEqual(worst, bound)
        # The gradient is computed in float32 as well, and rounded once.
        grad = jax.vmap(jax.grad(fn))(x)
        self.assertEqual(grad.dtype, dtype)
        grad32 = jax.vmap(jax.grad(fn))(x.astype(jnp.float32)).astype(dtype)
        np.testing.assert_array_equal(grad, grad32)

    def test_float32_is_the_erf_form_bit_for_bit(self):
        """The fix is for narrower dtypes: float32 keeps issue 42's erf form exactly."""
        x = jnp.asarray(_normal(5, (4096,)) * 3.0)

        def erf_form(x):  # functional.gelu of issue 42, written in the input's dtype
            half = jnp.asarray(0.5, x.dtype)
            return half * x * (1 + jax.lax.erf(x * jnp.asarray(0.7071067811865476, x.dtype)))

        np.testing.assert_array_equal(jax.jit(gelu)(x), jax.jit(erf_form)(x))
        np.testing.assert_array_equal(
            jax.jit(gelu_tanh)(x), jax.jit(lambda x: jax.nn.gelu(x, approximate=True))(x)
        )


class ProjectTest(chex.TestCase):
    @parameterized.named_parameters(
        ("rows", (6, 8), (8, 5)),
        ("batch_time_heads", (2, 3, 8), (8, 3, 4, 2)),
        ("no_leading_axis", (8,), (8, 7)),
    )
    def test_equals_tensordot_in_float64(self, x_shape, w_shape):
        x, w = _normal(0, x_shape), _normal(1, w_shape)
        out = jax.jit(project)(x, w)
        chex.assert_shape(out, (*x_shape[:-1], *w_shape[1:]))
        expected = np.tensordot(np.float64(x), np.float64(w), axes=1)
        np.testing.assert_allclose(out, expected, **TOL)

    def test_gradients_equal_tensordot_gradients(self):
        x, w = _normal(0, (2, 3, 8)), _normal(1, (8, 2, 4))

        def loss(f):
            return lambda x, w: jnp.sum(jnp.sin(f(x, w)))

        ours = jax.grad(loss(project), argnums=(0, 1))(x, w)
        theirs = jax.grad(loss(lambda x, w: jnp.tensordot(x, w, axes=1)), argnums=(0, 1))(x, w)
        for a, b in zip(ours, theirs, strict=True):
            np.testing.assert_allclose(a, b, **TOL)

    def test_width_mismatch_names_both_sizes(self):
        with self.assertRaisesRegex(ValueError, "x has 8 features but w has 6 rows"):
            project(np.zeros((2, 8), np.float32), np.zeros((6, 3), np.float32))
        with self.assertRaisesRegex(ValueError, "need at least one axis"):
            project(np.float32(1.0), np.zeros((1, 3), np.float32))
