"""Shapes, parameters and equivalences of the linen layers."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from flax_transformer import (
    FeedForward,
    LayerNorm,
    MultiHeadAttention,
    PositionalEncoding,
    causal_mask,
    combine_masks,
    dot_product_attention,
    layer_norm,
    padding_mask,
    sinusoidal_positions,
)

B, T, S, D, N = 2, 5, 7, 16, 4
H = D // N


def _init(module, *args, **kwargs):
    variables = module.init(jax.random.key(0), *args, **kwargs)
    return nn.unbox(variables)


def test_layer_norm_module_matches_function_and_flax():
    x = jax.random.normal(jax.random.key(1), (B, T, D)) * 3 + 1
    module = LayerNorm()
    params = _init(module, x)
    chex.assert_trees_all_equal_shapes(
        params, {"params": {"scale": jnp.ones(D), "bias": jnp.zeros(D)}}
    )
    params = jax.tree.map(lambda p: p + jax.random.normal(jax.random.key(2), p.shape), params)
    y = module.apply(params, x)
    chex.assert_shape(y, (B, T, D))
    p = params["params"]
    chex.assert_trees_all_close(y, layer_norm(x, p["scale"], p["bias"]), atol=1e-6)
    reference = nn.LayerNorm(epsilon=1e-5).apply(params, x)
    chex.assert_trees_all_close(y, reference, atol=1e-5)


def test_feed_forward_shapes_and_relu():
    x = jax.random.normal(jax.random.key(1), (B, T, D))
    module = FeedForward(d_ff=32)
    params = _init(module, x)["params"]
    assert {k: v.shape for k, v in params.items()} == {
        "wi_kernel": (D, 32),
        "wi_bias": (32,),
        "wo_kernel": (32, D),
        "wo_bias": (D,),
    }
    y = module.apply({"params": params}, x)
    expected = np.maximum(np.asarray(x) @ params["wi_kernel"], 0) @ params["wo_kernel"]
    chex.assert_trees_all_close(y, expected, atol=1e-5)


@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh"])
def test_bfloat16_feed_forward_gelu_is_one_rounding_of_the_exact_value(activation):
    """Issue 52: FeedForward(activation='gelu', dtype=bfloat16) was 18% off where GELU is
    small and negative. With identity kernels and no bias the layer is its activation (a
    bfloat16 matmul by the identity is exact), so every output with |gelu| > 1e-2 must be
    within bfloat16's unit roundoff, 2**-8, of the float64 value (float32's own error in
    the erf form is 2.6e-5 there)."""
    import math

    width = 64
    x = jnp.linspace(-6.0, 6.0, 50 * width).reshape(1, 50, width).astype(jnp.bfloat16)
    module = FeedForward(d_ff=width, activation=activation, use_bias=False, dtype=jnp.bfloat16)
    eye = jnp.eye(width)
    y = module.apply({"params": {"wi_kernel": eye, "wo_kernel": eye}}, x)
    assert y.dtype == jnp.bfloat16
    x64 = np.asarray(x.astype(jnp.float32), np.float64)
    if activation == "gelu":
        want = x64 * 0.5 * (1.0 + np.vectorize(math.erf)(x64 / math.sqrt(2.0)))
    else:
        want = 0.5 * x64 * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x64 + 0.044715 * x64**3)))
    got = np.asarray(y.astype(jnp.float32), np.float64)
    big = np.abs(want) > 1e-2
    assert np.max(np.abs(got - want)[big] / np.abs(want[big])) <= 2.0**-8 + 3e-5


def test_self_attention_parameter_shapes():
    x = jnp.ones((B, T, D))
    params = _init(MultiHeadAttention(num_heads=N), x)["params"]
    assert {k: v.shape for k, v in params.items()} == {
        "qkv_kernel": (D, 3, N, H),
        "qkv_bias": (3, N, H),
        "out_kernel": (N, H, D),
        "out_bias": (D,),
    }


def test_cross_attention_parameter_shapes_and_output():
    x, m = jnp.ones((B, T, D)), jnp.ones((B, S, D))
    module = MultiHeadAttention(num_heads=N, cross=True)
    params = _init(module, x, m)["params"]
    assert {k: v.shape for k, v in params.items()} == {
        "query_kernel": (D, N, H),
        "query_bias": (N, H),
        "kv_kernel": (D, 2, N, H),
        "kv_bias": (2, N, H),
        "out_kernel": (N, H, D),
        "out_bias": (D,),
    }
    chex.assert_shape(module.apply({"params": params}, x, m), (B, T, D))


def test_fused_heads_equal_independent_single_heads():
    """Raschka ch. 3, §3.6 (multi-head attention): N single-head attentions, concatenated,
    then W_O, equal the fused module."""
    x = jax.random.normal(jax.random.key(3), (B, T, D))
    mask = causal_mask(T)
    module = MultiHeadAttention(num_heads=N)
    params = _init(module, x)["params"]
    params = jax.tree.map(lambda p: p + 0.1 * jax.random.normal(jax.random.key(4), p.shape), params)
    fused = module.apply({"params": params}, x, mask=mask)

    wqkv, bqkv = params["qkv_kernel"], params["qkv_bias"]
    outputs = []
    for b in range(B):
        heads = []
        for n in range(N):
            q = x[b] @ wqkv[:, 0, n] + bqkv[0, n]
            k = x[b] @ wqkv[:, 1, n] + bqkv[1, n]
            v = x[b] @ wqkv[:, 2, n] + bqkv[2, n]
            heads.append(dot_product_attention(q, k, v, mask)[0])
        concat_TD = jnp.concatenate(heads, axis=-1)
        outputs.append(concat_TD @ params["out_kernel"].reshape(D, D) + params["out_bias"])
    chex.assert_trees_all_close(fused, jnp.stack(outputs), atol=1e-5)


def test_sown_weights_equal_functional_weights():
    x = jax.random.normal(jax.random.key(5), (B, T, D))
    module = MultiHeadAttention(num_heads=N)
    params = _init(module, x)
    _, state = module.apply(params, x, mask=causal_mask(T), mutable=["intermediates"])
    (weights,) = state["intermediates"]["attention_weights"]
    chex.assert_shape(weights, (B, N, T, T))
    p = params["params"]
    q = jnp.einsum("btd,dnh->btnh", x, p["qkv_kernel"][:, 0]) + p["qkv_bias"][0]
    k = jnp.einsum("btd,dnh->btnh", x, p["qkv_kernel"][:, 1]) + p["qkv_bias"][1]
    v = jnp.einsum("btd,dnh->btnh", x, p["qkv_kernel"][:, 2]) + p["qkv_bias"][2]
    _, expected = dot_product_attention(q[1, :, 2], k[1, :, 2], v[1, :, 2], causal_mask(T))
    chex.assert_trees_all_close(weights[1, 2], expected, atol=1e-6)
    # Not recorded unless asked for.
    _, state = module.apply(params, x, mutable=[])
    assert "intermediates" not in state


@pytest.mark.parametrize(
    "changes", [{}, {"rope": True, "num_kv_heads": 2}], ids=["fused", "rope-grouped"]
)
def test_sown_inputs_give_the_sown_weights(changes):
    """'attention_inputs' holds the queries, keys (rotated, for rope) and values that the
    weights came from, and the mask as (B, N, T, S); nothing is sown unless asked for."""
    x = jax.random.normal(jax.random.key(6), (B, T, D))
    module = MultiHeadAttention(num_heads=N, **changes)
    params = _init(module, x)
    _, state = module.apply(params, x, mask=causal_mask(T), mutable=["intermediates"])
    (weights,) = state["intermediates"]["attention_weights"]
    (inputs,) = state["intermediates"]["attention_inputs"]
    kv_heads = changes.get("num_kv_heads", N)
    chex.assert_shape(inputs["q"], (B, T, N, H))
    chex.assert_shape([inputs["k"], inputs["v"]], (B, T, kv_heads, H))
    assert inputs["mask"].shape == (B, N, T, T) and inputs["mask"].dtype == jnp.bool_
    group = N // kv_heads
    for b, n in ((0, 0), (1, N - 1)):
        q, k = inputs["q"][b, :, n], inputs["k"][b, :, n // group]
        _, expected = dot_product_attention(q, k, inputs["v"][b, :, n // group], causal_mask(T))
        chex.assert_trees_all_close(weights[b, n], expected, atol=1e-6)
        assert np.array_equal(inputs["mask"][b, n], causal_mask(T))
    _, state = module.apply(params, x, mask=causal_mask(T), mutable=[])
    assert "intermediates" not in state


def test_causal_and_padding_mask_is_per_example_not_per_head():
    """A past defect: `combine_masks(causal_mask(T), padding_mask(tokens))` used to be (B, T, S),
    which broadcasting against (B, N, T, S) applied to head b, not example b. Now it is
    (B, 1, T, S), each example's output equals running that example alone, and a rank-3
    mask raises."""
    tok = jnp.array([[5, 6, 0, 0], [5, 6, 7, 0], [5, 0, 0, 0], [5, 6, 7, 8]])
    lengths = [2, 3, 1, 4]
    x = jax.random.normal(jax.random.key(16), (4, 4, 32))
    module = MultiHeadAttention(num_heads=4)
    params = _init(module, x)
    apply = jax.jit(module.apply)
    mask = combine_masks(causal_mask(4), padding_mask(tok))
    chex.assert_shape(mask, (4, 1, 4, 4))
    batched = apply(params, x, mask=mask)
    for b, n in enumerate(lengths):
        alone = module.apply(params, x[b : b + 1, :n], mask=causal_mask(n))
        chex.assert_trees_all_close(batched[b, :n], alone[0], atol=1e-5)
    with pytest.raises(ValueError, match=r"rank 3.*mask\[:, None\]"):
        combine_masks(causal_mask(4), (tok != 0)[:, None, :])  # the old (B, T, S) shape
    rank3 = causal_mask(4) & (tok != 0)[:, None, :]
    chex.assert_shape(rank3, (4, 4, 4))
    for impl in ("xla", "jax_nn"):
        with pytest.raises(ValueError, match=r"rank 3.*mask\[:, None\]"):
            MultiHeadAttention(num_heads=4, impl=impl).apply(params, x, mask=rank3)
    # The fix the message names gives the right answer.
    chex.assert_trees_all_close(apply(params, x, mask=rank3[:, None]), batched)


def test_jax_nn_attention_impl_matches_xla():
    x = jax.random.normal(jax.random.key(6), (B, T, D))
    mask = causal_mask(T)
    ours = MultiHeadAttention(num_heads=N)
    params = _init(ours, x)
    theirs = MultiHeadAttention(num_heads=N, impl="jax_nn")
    chex.assert_trees_all_close(
        ours.apply(params, x, mask=mask), theirs.apply(params, x, mask=mask), atol=1e-5
    )


def test_jax_nn_impl_sows_weights_by_running_ours(monkeypatch):
    """jax.nn.dot_product_attention returns no weights: with 'intermediates' mutable, the
    'jax_nn' module runs our formula for that call and sows the same weights as 'xla'."""
    x = jax.random.normal(jax.random.key(9), (B, T, D))
    mask = causal_mask(T)
    ours = MultiHeadAttention(num_heads=N)
    params = _init(ours, x)
    theirs = MultiHeadAttention(num_heads=N, impl="jax_nn")
    calls = []
    original = jax.nn.dot_product_attention
    monkeypatch.setattr(
        jax.nn, "dot_product_attention", lambda *a, **kw: calls.append(1) or original(*a, **kw)
    )
    y_ours, state_ours = ours.apply(params, x, mask=mask, mutable=["intermediates"])
    y, state = theirs.apply(params, x, mask=mask, mutable=["intermediates"])
    (weights,) = state["intermediates"]["attention_weights"]
    chex.assert_shape(weights, (B, N, T, T))
    chex.assert_trees_all_close((y, state), (y_ours, state_ours), atol=1e-6)
    assert not calls
    # Without the collection it runs jax.nn (and sows nothing).
    _, state = theirs.apply(params, x, mask=mask, mutable=[])
    assert "intermediates" not in state and len(calls) == 1


def test_bf16_compute_keeps_float32_params_and_softmax():
    x = jax.random.normal(jax.random.key(7), (B, T, D))
    module = MultiHeadAttention(num_heads=N, dtype=jnp.bfloat16)
    params = _init(module, x)
    assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(params))
    y, state = module.apply(params, x, mutable=["intermediates"])
    assert y.dtype == jnp.bfloat16
    assert state["intermediates"]["attention_weights"][0].dtype == jnp.float32


def test_attention_dropout_uses_rng_and_is_off_when_deterministic():
    x = jax.random.normal(jax.random.key(8), (B, T, D))
    module = MultiHeadAttention(num_heads=N, dropout_rate=0.5)
    params = _init(module, x)
    base = module.apply(params, x)
    chex.assert_trees_all_close(base, module.apply(params, x, deterministic=True))
    a = module.apply(params, x, deterministic=False, rngs={"dropout": jax.random.key(1)})
    b = module.apply(params, x, deterministic=False, rngs={"dropout": jax.random.key(1)})
    c = module.apply(params, x, deterministic=False, rngs={"dropout": jax.random.key(2)})
    chex.assert_trees_all_close(a, b)
    assert not np.allclose(a, base) and not np.allclose(a, c)


def test_positional_encoding_adds_table_and_rejects_long_input():
    x = jnp.zeros((B, T, D))
    module = PositionalEncoding(max_len=10)
    y = module.apply({}, x)
    chex.assert_trees_all_close(y[0], sinusoidal_positions(T, D), atol=1e-6)
    learned = PositionalEncoding(max_len=10, kind="learned")
    params = _init(learned, x)
    chex.assert_shape(params["params"]["pos_embedding"], (10, D))
    with pytest.raises(ValueError, match="exceeds max_len=10"):
        module.apply({}, jnp.zeros((1, 11, D)))


def test_head_count_must_divide_width():
    with pytest.raises(ValueError, match="num_heads=3 does not divide"):
        MultiHeadAttention(num_heads=3).init(jax.random.key(0), jnp.ones((1, 2, D)))
