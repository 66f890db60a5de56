"""The speedrun's model options (issue 51): QK-norm, ReLU squared, logit soft-capping, each
against its formula in float64 numpy, and their defaults leaving every model as it was.

Cached decoding with them on equals recomputation in tests/test_decoding.py; the exporters'
refusals in tests/test_export.py and tests/test_llama.py.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from flax_transformer import (
    DecoderOnlyTransformer,
    FeedForward,
    MultiHeadAttention,
    Transformer,
    TransformerConfig,
    causal_mask,
)
from flax_transformer.functional import relu_squared, soft_cap

SMALL = dict(vocab_size=37, d_model=16, num_heads=2, d_ff=24, num_layers=2, max_len=16)


def _leaf_names(variables) -> set[str]:
    flat = jax.tree_util.tree_flatten_with_path(nn.unbox(variables))[0]
    return {"/".join(str(getattr(k, "key", k)) for k in path) for path, _ in flat}


def _noisy(variables, seed: int = 0, std: float = 0.3):
    """Initialised parameters plus noise on every leaf, so scales of 1 become other numbers."""
    params = nn.unbox(variables)
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    return jax.tree.unflatten(
        tree, [x + std * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys, strict=True)]
    )


# --------------------------------------------------------------------------- ReLU squared


def test_relu_squared_formula_and_gradient():
    x = np.linspace(-3.0, 3.0, 13)
    expected = np.maximum(x, 0.0) ** 2
    np.testing.assert_allclose(relu_squared(jnp.asarray(x, jnp.float32)), expected, rtol=1e-6)
    grad = jax.vmap(jax.grad(lambda v: relu_squared(v)))(jnp.asarray(x, jnp.float32))
    np.testing.assert_allclose(grad, 2 * np.maximum(x, 0.0), rtol=1e-6)
    assert relu_squared(jnp.ones(3, jnp.bfloat16)).dtype == jnp.bfloat16


def test_relu2_feed_forward_against_float64():
    x = jax.random.normal(jax.random.key(0), (2, 3, 8))
    module = FeedForward(d_ff=12, activation="relu2")
    params = _noisy(module.init(jax.random.key(1), x))
    p = params["params"]
    f64 = {k: np.asarray(v, np.float64) for k, v in p.items()}
    hidden = np.asarray(x, np.float64) @ f64["wi_kernel"] + f64["wi_bias"]
    expected = np.maximum(hidden, 0.0) ** 2 @ f64["wo_kernel"] + f64["wo_bias"]
    np.testing.assert_allclose(module.apply(params, x), expected, rtol=1e-5, atol=1e-5)
    assert set(p) == {"wi_kernel", "wi_bias", "wo_kernel", "wo_bias"}  # two kernels: not gated


# --------------------------------------------------------------------------- soft-capping


def test_soft_cap_formula():
    x = np.array([-1000.0, -30.0, -1.0, 0.0, 0.5, 10.0, 1e6])
    got = np.asarray(soft_cap(jnp.asarray(x, jnp.float32), 15.0))
    np.testing.assert_allclose(got, 15.0 * np.tanh(x / 15.0), rtol=1e-6, atol=1e-6)
    assert np.all(np.abs(got) <= 15.0)
    # Near 0 the identity: slope 1.
    assert float(jax.grad(lambda v: soft_cap(v, 15.0))(0.0)) == pytest.approx(1.0)
    assert soft_cap(jnp.ones(2, jnp.bfloat16), 2.0).dtype == jnp.bfloat16


@pytest.mark.parametrize("cap", [-1.0, float("nan"), float("inf")])
def test_soft_cap_refuses_a_cap_that_is_negative_or_not_finite(cap):
    with pytest.raises(ValueError, match=r"soft_cap: cap=.* must be"):
        soft_cap(jnp.ones(2), cap)
    with pytest.raises(TypeError, match="floating"):
        soft_cap(jnp.ones(2, jnp.int32), 1.0)
    # Traced, the cap cannot be refused: NaN everywhere, never numbers that look right.
    assert np.isnan(jax.jit(soft_cap)(jnp.ones(2), cap)).all()


def test_soft_cap_gives_traced_caps_what_it_gives_python_caps():
    """cap 0 is off (the logits unchanged) eagerly, under jit and under vmap over caps; a
    positive cap is the formula in all three (before, a traced 0 gave all-zero logits)."""
    x = jnp.asarray([-40.0, -2.0, 0.0, 0.3, 7.0, 1e4], jnp.float32)
    caps = [0.0, 0.5, 15.0]
    eager = [np.asarray(soft_cap(x, c)) for c in caps]
    np.testing.assert_array_equal(eager[0], x)
    jitted = [np.asarray(jax.jit(soft_cap)(x, c)) for c in caps]
    mapped = jax.vmap(soft_cap, in_axes=(None, 0))(x, jnp.asarray(caps, jnp.float32))
    for c, want, got_jit, got_vmap in zip(caps, eager, jitted, mapped, strict=True):
        np.testing.assert_allclose(got_jit, want, rtol=1e-6, err_msg=f"jit, cap={c}")
        np.testing.assert_allclose(got_vmap, want, rtol=1e-6, err_msg=f"vmap, cap={c}")
    # The gradients agree too, and the off branch's is that of the identity, not NaN.
    grad = jax.grad(lambda v, c: soft_cap(v, c).sum())
    for c in caps:
        np.testing.assert_allclose(jax.jit(grad)(x, c), grad(x, c), rtol=1e-6)
    np.testing.assert_array_equal(jax.jit(grad)(x, 0.0), np.ones(6, np.float32))


@pytest.mark.parametrize("tied", [True, False])
def test_logits_are_the_capped_logits_of_the_same_weights(tied):
    """One set of weights: the capped model's logits are cap * tanh(uncapped / cap)."""
    cap = 0.5  # below the random model's logits, so the cap changes them
    tokens = jnp.array([[1, 5, 7, 9, 2], [3, 4, 6, 8, 0]])
    config = TransformerConfig(**SMALL, tie_output_embedding=tied, output_bias=True)
    plain = DecoderOnlyTransformer(config)
    params = _noisy(plain.init(jax.random.key(0), tokens), std=1.0)
    raw = np.asarray(plain.apply(params, tokens), np.float64)
    assert np.abs(raw).max() > 2 * cap
    capped = DecoderOnlyTransformer(config.replace(logits_soft_cap=cap)).apply(params, tokens)
    np.testing.assert_allclose(capped, cap * np.tanh(raw / cap), rtol=1e-5, atol=1e-6)
    src = jnp.array([[4, 5, 6, 0]])
    mt = Transformer(config)
    mt_params = _noisy(mt.init(jax.random.key(0), src, tokens[:1]), std=1.0)
    raw = np.asarray(mt.apply(mt_params, src, tokens[:1]), np.float64)
    capped = Transformer(config.replace(logits_soft_cap=cap)).apply(mt_params, src, tokens[:1])
    np.testing.assert_allclose(capped, cap * np.tanh(raw / cap), rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- QK-norm


def _rms(x, scale, eps):
    return x / np.sqrt((x**2).mean(-1, keepdims=True) + eps) * scale


def _softmax(s):
    s = s - s.max(-1, keepdims=True)
    e = np.exp(s)
    return e / e.sum(-1, keepdims=True)


def _reference_attention(p, x_q, x_kv, mask, num_heads, kv_heads, eps):
    """The layer in float64: project, RMSNorm each head's q and k over H (learned scales),
    scaled dot-product attention per head (query head i reads kv head i // (N // K)), W_O."""
    f = {k: np.asarray(v, np.float64) for k, v in p.items()}
    x_q, x_kv = np.asarray(x_q, np.float64), np.asarray(x_kv, np.float64)
    if "qkv_kernel" in f:
        qkv = np.einsum("btd,dcnh->btcnh", x_q, f["qkv_kernel"]) + f["qkv_bias"]
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    else:
        q = np.einsum("btd,dnh->btnh", x_q, f["query_kernel"]) + f["query_bias"]
        kv = np.einsum("bsd,dcnh->bscnh", x_kv, f["kv_kernel"]) + f["kv_bias"]
        k, v = kv[:, :, 0], kv[:, :, 1]
    q = _rms(q, f["query_norm_scale"], eps)
    k = _rms(k, f["key_norm_scale"], eps)
    group = num_heads // kv_heads
    k, v = np.repeat(k, group, axis=2), np.repeat(v, group, axis=2)
    scores = np.einsum("btnh,bsnh->bnts", q, k) / np.sqrt(q.shape[-1])
    scores = np.where(mask, scores, -np.inf)
    out = np.einsum("bnts,bsnh->btnh", _softmax(scores), v)
    return np.einsum("btnh,nhd->btd", out, f["out_kernel"]) + f["out_bias"]


@pytest.mark.parametrize(
    "cross, kv_heads", [(False, None), (False, 1), (True, None)], ids=["self", "self-mqa", "cross"]
)
def test_qk_norm_attention_against_float64(cross, kv_heads):
    keys = jax.random.split(jax.random.key(3), 2)
    x_q = 2.0 * jax.random.normal(keys[0], (2, 5, 16))
    x_kv = 2.0 * jax.random.normal(keys[1], (2, 7, 16)) if cross else None
    mask = np.ones((5, 7), bool) if cross else np.asarray(causal_mask(5))
    layer = MultiHeadAttention(
        num_heads=4, cross=cross, num_kv_heads=kv_heads, qk_norm=True, qk_norm_eps=1e-5
    )
    params = _noisy(layer.init(jax.random.key(0), x_q, x_kv, mask))
    p = params["params"]
    assert p["query_norm_scale"].shape == p["key_norm_scale"].shape == (4,)
    got = layer.apply(params, x_q, x_kv, mask)
    expected = _reference_attention(
        p, x_q, x_q if x_kv is None else x_kv, mask, 4, kv_heads or 4, 1e-5
    )
    np.testing.assert_allclose(got, expected, rtol=2e-5, atol=2e-5)


def test_qk_norm_makes_scores_independent_of_the_projection_scale():
    """The point of QK-norm: scaling W_Q and W_K up leaves the attention unchanged (the
    logits cannot grow with the weights), where the plain layer's weights sharpen."""
    x = jax.random.normal(jax.random.key(4), (1, 6, 16))
    mask = causal_mask(6)

    def outputs(qk_norm):
        layer = MultiHeadAttention(num_heads=2, qk_norm=qk_norm, use_bias=False)
        params = nn.unbox(layer.init(jax.random.key(0), x, mask=mask))
        bigger = jax.tree.map(lambda v: v, params)
        qkv = bigger["params"]["qkv_kernel"]
        bigger["params"]["qkv_kernel"] = qkv.at[:, :2].multiply(10.0)  # queries and keys
        return layer.apply(params, x, mask=mask), layer.apply(bigger, x, mask=mask)

    normal, scaled = outputs(qk_norm=True)
    np.testing.assert_allclose(normal, scaled, rtol=1e-4, atol=1e-5)
    plain, sharpened = outputs(qk_norm=False)
    change = np.abs(np.asarray(plain) - np.asarray(sharpened)).max()
    assert change > 0.1 * np.abs(np.asarray(plain)).max()


def test_qk_norm_adds_two_scales_to_every_attention_and_nothing_else():
    src, tgt = jnp.array([[4, 5, 6, 0]]), jnp.array([[1, 7, 8]])
    base = TransformerConfig(**SMALL)
    plain = _leaf_names(Transformer(base).init(jax.random.key(0), src, tgt))
    normed = _leaf_names(Transformer(base.replace(qk_norm=True)).init(jax.random.key(0), src, tgt))
    added = normed - plain
    assert plain <= normed
    # 2 encoder layers (self) + 2 decoder layers (self, cross), two scales each.
    assert len(added) == 2 * (2 + 2 * 2)
    assert {name.rsplit("/", 1)[1] for name in added} == {"query_norm_scale", "key_norm_scale"}


# --------------------------------------------------------------------------- config


@pytest.mark.parametrize("changes", [dict(qk_norm=True), dict(logits_soft_cap=30.0)])
def test_importers_refuse_what_no_source_has(changes):
    """torch's stacks, GPT-2 and Llama have neither: every importer ends in `finish_params`,
    which names the field before reading any weight (the cap would import silently)."""
    from flax_transformer.interop._util import dummy_tokens, finish_params

    config = TransformerConfig(**SMALL, **changes)
    name = next(iter(changes))
    with pytest.raises(ValueError, match=rf"no QK-norm and no logit soft-capping.*{name}="):
        finish_params({}, DecoderOnlyTransformer(config), config, dummy_tokens())


def test_defaults_are_the_papers_and_bad_values_are_named():
    config = TransformerConfig()
    assert (config.qk_norm, config.logits_soft_cap, config.activation) == (False, 0.0, "relu")
    assert config.layer_config.qk_norm is False
    assert TransformerConfig(qk_norm=True).layer_config.qk_norm is True
    TransformerConfig(activation="relu2")
    with pytest.raises(ValueError, match=r"TransformerConfig.qk_norm='yes' must be True or False"):
        TransformerConfig(qk_norm="yes")
    for bad in (-1.0, float("nan"), "30"):
        with pytest.raises(ValueError, match=r"TransformerConfig.logits_soft_cap="):
            TransformerConfig(logits_soft_cap=bad)
