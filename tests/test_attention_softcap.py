"""Gemma 2's attention-logit soft-capping (`attn_logit_softcapping`): scores = c * tanh(scores
/ c) before the mask and the softmax, against a float64 numpy reference of the formula, in
'xla', 'blocked' and cached decoding; the fused kernels refuse it."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from flax_transformer import (
    DecoderOnlyTransformer,
    MultiHeadAttention,
    TransformerConfig,
    multi_head_attention,
)
from flax_transformer.decoding import init_cache
from flax_transformer.functional.blocked_attention import blocked_attention

CAP = 2.0  # below the scores of the inputs below, so the cap changes them
SMALL = dict(vocab_size=37, d_model=16, num_heads=2, d_ff=24, num_layers=2, max_len=16)


def _reference(q, k, v, mask, cap):
    """float64 numpy: softmax(mask(cap * tanh(q k^T / sqrt(H) / cap))) v, per (b, n)."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    scores = np.einsum("btnh,bsnh->bnts", q, k) / np.sqrt(q.shape[-1])
    if cap is not None:
        scores = cap * np.tanh(scores / cap)
    scores = np.where(mask, scores, -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    return np.einsum("bnts,bsnh->btnh", weights, v), weights


def _qkv(seed=0, b=2, t=5, n=2, h=4, std=3.0):
    keys = jax.random.split(jax.random.key(seed), 3)
    return [std * jax.random.normal(key, (b, t, n, h), jnp.float32) for key in keys]


def test_functional_attention_caps_the_scores_before_mask_and_softmax():
    q, k, v = _qkv()
    mask = np.tril(np.ones((5, 5), bool))[None, None]
    want_out, want_w = _reference(q, k, v, mask, CAP)
    for fn in (
        multi_head_attention,
        jax.jit(multi_head_attention, static_argnames="logit_softcap"),
    ):
        out, weights = fn(q, k, v, jnp.asarray(mask), logit_softcap=CAP)
        np.testing.assert_allclose(weights, want_w, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(out, want_out, rtol=1e-5, atol=1e-5)
    plain, _ = _reference(q, k, v, mask, None)
    assert np.abs(plain - want_out).max() > 0.1  # the cap matters at these scores
    blocked = blocked_attention(q, k, v, causal=True, block=2, logit_softcap=CAP)
    np.testing.assert_allclose(blocked, want_out, rtol=1e-5, atol=1e-5)


def test_blocked_gradients_equal_the_reference_with_the_cap():
    q, k, v = _qkv(1)

    def loss(fn):
        return lambda q, k, v: jnp.sum(jnp.sin(fn(q, k, v)))

    xla = loss(lambda q, k, v: multi_head_attention(q, k, v, logit_softcap=CAP)[0])
    blocked = loss(lambda q, k, v: blocked_attention(q, k, v, block=2, logit_softcap=CAP))
    want = jax.grad(xla, argnums=(0, 1, 2))(q, k, v)
    got = jax.grad(blocked, argnums=(0, 1, 2))(q, k, v)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize("impl", ["xla", "blocked"])
def test_the_module_caps_its_scores(impl):
    x = 3.0 * jax.random.normal(jax.random.key(2), (2, 5, 8))
    module = MultiHeadAttention(num_heads=2, impl=impl, use_bias=False, attn_logit_softcapping=CAP)
    params = module.init(jax.random.key(3), x)
    p = jax.tree.map(lambda a: 4.0 * a, nn.unbox(params["params"]))  # large scores
    qkv = np.einsum("btd,dpnh->btpnh", np.asarray(x, np.float64), np.asarray(p["qkv_kernel"]))
    mask = np.ones((1, 1, 5, 5), bool)
    out, _ = _reference(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], mask, CAP)
    want = np.einsum("btnh,nhd->btd", out, np.asarray(p["out_kernel"], np.float64))
    np.testing.assert_allclose(module.apply({"params": p}, x), want, rtol=1e-4, atol=1e-5)


def test_the_model_caps_in_every_layer_and_cached_decoding_equals_recomputation():
    tokens = jnp.array([[3, 5, 7, 9, 11, 2], [4, 6, 8, 10, 12, 1]])
    config = TransformerConfig(**SMALL, dropout_rate=0.0, attn_logit_softcapping=0.5)
    model = DecoderOnlyTransformer(config)
    params = nn.unbox(model.init(jax.random.key(0), tokens))
    # Weights of std ~0.5 rather than 0.02: scores well beyond the cap.
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(1), len(leaves))
    noise = [x + 0.5 * jax.random.normal(key, x.shape) for x, key in zip(leaves, keys, strict=True)]
    params = jax.tree.unflatten(tree, noise)
    full = model.apply(params, tokens)
    plain = DecoderOnlyTransformer(config.replace(attn_logit_softcapping=None))
    assert np.abs(plain.apply(params, tokens) - full).max() > 1e-3
    blocked = DecoderOnlyTransformer(config.replace(attention_impl="blocked"))
    np.testing.assert_allclose(blocked.apply(params, tokens), full, rtol=1e-5, atol=1e-5)
    cache = init_cache(config, 2, 8)
    logits, cache = model.apply(params, tokens[:, :3], cache, method="extend")
    steps = [logits]
    for t in range(3, 6):
        logits, cache = model.apply(params, tokens[:, t : t + 1], cache, method="extend")
        steps.append(logits)
    np.testing.assert_allclose(jnp.concatenate(steps, 1), full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("impl", ["jax_nn", "splash", "cudnn"])
def test_fused_kernels_refuse_it_naming_the_field_and_the_impls_that_run_it(impl):
    with pytest.raises(ValueError, match=r"attn_logit_softcapping=5.0 .*\('xla', 'blocked'\)"):
        TransformerConfig(attention_impl=impl, attn_logit_softcapping=5.0)
    with pytest.raises(ValueError, match=r"attn_logit_softcapping=5.0 .*\('xla', 'blocked'\)"):
        MultiHeadAttention(num_heads=2, impl=impl, attn_logit_softcapping=5.0).init(
            jax.random.key(0), jnp.ones((1, 3, 8))
        )


@pytest.mark.parametrize("bad", [0.0, -1.0, float("inf"), "50"])
def test_a_cap_that_is_not_a_finite_positive_number_is_refused(bad):
    with pytest.raises(ValueError, match=r"TransformerConfig.attn_logit_softcapping="):
        TransformerConfig(attn_logit_softcapping=bad)
    assert TransformerConfig().attn_logit_softcapping is None  # off by default
