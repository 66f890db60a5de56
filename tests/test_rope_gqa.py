"""Rotary positions and grouped-query attention: formulas, identities, models.

Cached decoding with both options is tested with the other decoding tests
(`test_decoding.test_rope_and_grouped_query_cache_equals_full_recomputation`).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from flax_transformer import (
    DecoderOnlyTransformer,
    MultiHeadAttention,
    Transformer,
    TransformerConfig,
    apply_rope,
    multi_head_attention,
)
from flax_transformer.decoding import init_cache
from flax_transformer.functional import rope_angles

SMALL = dict(
    vocab_size=40, d_model=32, num_heads=4, d_ff=48, num_layers=2, max_len=24, dropout_rate=0.0
)
TOKENS = jnp.array([[1, 5, 7, 9, 3, 0, 0], [1, 3, 4, 2, 8, 6, 11]])
SOURCE = jnp.array([[4, 5, 6, 9, 0], [3, 3, 2, 1, 7]])


def _rotation_matrix(position: float, head_dim: int, base: float) -> np.ndarray:
    """The `(H, H)` block rotation of rotate-half RoPE: pair i is features (i, i + H/2)."""
    half = head_dim // 2
    rot = np.zeros((head_dim, head_dim))
    for i in range(half):
        angle = position * base ** (-2.0 * i / head_dim)
        c, s = np.cos(angle), np.sin(angle)
        rot[i, i], rot[i, i + half] = c, -s
        rot[i + half, i], rot[i + half, i + half] = s, c
    return rot


@pytest.mark.parametrize("base", [10000.0, 100.0])
def test_apply_rope_is_a_rotation_matrix_per_position(base):
    x_TNH = jax.random.normal(jax.random.key(0), (6, 3, 8))
    positions_T = jnp.array([0, 1, 2, 5, 17, 300])
    out = np.asarray(apply_rope(x_TNH, positions_T, base))
    for t, pos in enumerate(np.asarray(positions_T)):
        expected = np.asarray(x_TNH[t], np.float64) @ _rotation_matrix(pos, 8, base).T
        np.testing.assert_allclose(out[t], expected, rtol=1e-5, atol=1e-5)
    # Position 0 is the identity, and a rotation keeps every head's norm.
    np.testing.assert_array_equal(out[0], np.asarray(x_TNH[0]))
    np.testing.assert_allclose(
        np.linalg.norm(out, axis=-1), np.linalg.norm(np.asarray(x_TNH), axis=-1), rtol=1e-5
    )


def test_apply_rope_batched_dtype_and_errors():
    x_BTNH = jax.random.normal(jax.random.key(1), (2, 5, 3, 8))
    positions_BT = jnp.array([[0, 1, 2, 3, 4], [7, 8, 9, 10, 11]])
    batched = apply_rope(x_BTNH, positions_BT)
    for b in range(2):
        np.testing.assert_array_equal(batched[b], apply_rope(x_BTNH[b], positions_BT[b]))
    assert apply_rope(x_BTNH.astype(jnp.bfloat16), positions_BT).dtype == jnp.bfloat16
    assert rope_angles(jnp.arange(3), 8).shape == (3, 4)
    with pytest.raises(ValueError, match="even head_dim"):
        apply_rope(jnp.ones((4, 2, 7)), jnp.arange(4))
    with pytest.raises(ValueError, match="finite base > 0"):
        apply_rope(jnp.ones((4, 2, 8)), jnp.arange(4), base=-1.0)
    with pytest.raises(ValueError, match="same leading axes"):
        apply_rope(jnp.ones((4, 2, 8)), jnp.arange(5))


def test_rope_scores_depend_only_on_relative_position():
    """The rotation identity of sinusoidal positions (the paper §3.5), now for RoPE:
    rope(q, m) . rope(k, n) = q . R(n - m) k, so shifting both positions changes nothing."""
    q_TNH = jax.random.normal(jax.random.key(2), (5, 2, 16))
    k_SNH = jax.random.normal(jax.random.key(3), (7, 2, 16))
    q_pos, k_pos = jnp.array([0, 3, 4, 9, 10]), jnp.array([0, 1, 2, 5, 6, 9, 12])

    def scores(shift):
        q = apply_rope(q_TNH, q_pos + shift)
        k = apply_rope(k_SNH, k_pos + shift)
        return jnp.einsum("tnh,snh->nts", q, k)

    reference = scores(0)
    for shift in (1, 17, 250):
        np.testing.assert_allclose(scores(shift), reference, atol=1e-4, rtol=1e-5)
    # ... and they do depend on it: unrotated scores differ.
    assert not np.allclose(jnp.einsum("tnh,snh->nts", q_TNH, k_SNH), reference, atol=1e-3)


def test_rope_attention_layer_sees_relative_positions_only():
    """A rotary self-attention layer gives the same output for positions 0.. and 11..."""
    x = jax.random.normal(jax.random.key(4), (2, 6, 32))
    layer = MultiHeadAttention(num_heads=4, num_kv_heads=2, rope=True)
    params = layer.init(jax.random.key(0), x)
    positions = jnp.arange(6)[None, :]
    at_zero = layer.apply(params, x, positions_BT=positions)
    np.testing.assert_allclose(layer.apply(params, x), at_zero, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        layer.apply(params, x, positions_BT=positions + 11), at_zero, rtol=1e-4, atol=1e-5
    )
    plain = MultiHeadAttention(num_heads=4, num_kv_heads=2).apply(params, x)
    assert not np.allclose(plain, at_zero, atol=1e-4)
    with pytest.raises(ValueError, match="self-attention only"):
        MultiHeadAttention(num_heads=4, cross=True, rope=True).init(jax.random.key(0), x, x)


def test_rope_adds_nothing_to_the_embeddings():
    model = DecoderOnlyTransformer(TransformerConfig(**SMALL, positional="rope"))
    variables = model.init(jax.random.key(0), TOKENS)
    _, state = model.apply(variables, TOKENS, capture_intermediates=True, mutable=True)
    assert "positions" not in state["intermediates"]["decoder"]
    sinusoidal = DecoderOnlyTransformer(TransformerConfig(**SMALL))
    _, state = sinusoidal.apply(variables, TOKENS, capture_intermediates=True, mutable=True)
    assert "positions" in state["intermediates"]["decoder"]


def _to_mha(params, num_heads: int, cross_names=("cross_attention",)):
    """Walk the tree: self-attention query + kv -> fused qkv; cross-attention kv repeated."""

    def walk(tree, name=""):
        if not isinstance(tree, dict):
            return tree
        tree = {key: walk(sub, key) for key, sub in tree.items()}
        if "kv_kernel" not in tree:
            return tree
        group = num_heads // tree["kv_kernel"].shape[-2]
        out = dict(tree)
        for kind in ("kernel", "bias"):
            if f"kv_{kind}" not in tree:
                continue
            kv = jnp.repeat(out.pop(f"kv_{kind}"), group, axis=-2)  # (..., 2, N, H)
            if name in cross_names:
                out[f"kv_{kind}"] = kv
            else:
                query = out.pop(f"query_{kind}")  # (..., N, H)
                axis = query.ndim - 2  # the new (3,) axis, before N
                out[f"qkv_{kind}"] = jnp.concatenate([jnp.expand_dims(query, axis), kv], axis=axis)
        return out

    return walk(params)


@pytest.mark.parametrize(
    "kind, kv_heads",
    [
        ("decoder_only", 2),
        pytest.param("decoder_only", 1, marks=pytest.mark.slow),
        pytest.param("encoder_decoder", 2, marks=pytest.mark.slow),
        ("encoder_decoder", 1),  # multi-query, through self- and cross-attention
    ],
)
def test_grouped_query_equals_multi_head_with_repeated_kv_heads(kind, kv_heads):
    options = dict(SMALL, positional="rope")
    if kind == "decoder_only":
        make, args = DecoderOnlyTransformer, (TOKENS,)
    else:
        make, args = Transformer, (SOURCE, TOKENS)
    gqa = make(TransformerConfig(**options, num_kv_heads=kv_heads))
    mha = make(TransformerConfig(**options))
    params = nn.unbox(gqa.init(jax.random.key(0), *args))
    attention = params["params"]["decoder"]["layers_0"]["self_attention"]
    assert attention["query_kernel"].shape == (32, 4, 8)
    assert attention["kv_kernel"].shape == (32, 2, kv_heads, 8)
    assert "qkv_kernel" not in attention
    mha_params = _to_mha(params, num_heads=4)
    mha_shapes = nn.unbox(jax.eval_shape(mha.init, jax.random.key(0), *args))
    assert jax.tree.map(jnp.shape, mha_params) == jax.tree.map(jnp.shape, mha_shapes)
    np.testing.assert_allclose(
        gqa.apply(params, *args), mha.apply(mha_params, *args), rtol=1e-5, atol=1e-5
    )


def test_num_kv_heads_equal_to_num_heads_is_the_default_model():
    default = DecoderOnlyTransformer(TransformerConfig(**SMALL))
    same = DecoderOnlyTransformer(TransformerConfig(**SMALL, num_kv_heads=4))
    params = default.init(jax.random.key(0), TOKENS)
    assert jax.tree.map(jnp.shape, same.init(jax.random.key(0), TOKENS)) == jax.tree.map(
        jnp.shape, params
    )
    np.testing.assert_array_equal(same.apply(params, TOKENS), default.apply(params, TOKENS))


def test_grouped_query_functional_equals_repeated_heads_and_jax_nn():
    keys = jax.random.split(jax.random.key(5), 3)
    q = jax.random.normal(keys[0], (2, 5, 6, 8))
    k, v = (jax.random.normal(key, (2, 7, 2, 8)) for key in keys[1:])
    mask = jnp.tril(jnp.ones((5, 7), bool), k=2)
    out, weights = multi_head_attention(q, k, v, mask)
    rep_out, rep_weights = multi_head_attention(
        q, jnp.repeat(k, 3, axis=2), jnp.repeat(v, 3, axis=2), mask
    )
    np.testing.assert_allclose(out, rep_out, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(weights, rep_weights, rtol=1e-6, atol=1e-6)
    ref = jax.nn.dot_product_attention(q, k, v, mask=jnp.broadcast_to(mask, (2, 6, 5, 7)))
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="does not divide the queries' 6"):
        multi_head_attention(q, k[:, :, :1].repeat(4, axis=2), v[:, :, :1].repeat(4, axis=2))


@pytest.mark.parametrize("kv_heads", [4, 2, 1])
def test_cache_is_sized_by_kv_heads(kv_heads):
    config = TransformerConfig(**SMALL, num_kv_heads=kv_heads)
    cache = init_cache(config, 3, 10, source_length=5)
    layer = cache["decoder"]["layers_0"]
    assert layer["self_attention"]["k"].shape == (3, kv_heads, 10, 8)
    assert layer["cross_attention"]["v"].shape == (3, kv_heads, 5, 8)
    from benchmarks.kv_cache import cache_bytes_per_token

    # 2 layers x (k, v) x K heads x H 8 x 4 bytes, read off the cache pytree.
    assert cache_bytes_per_token(config) == {"self": 128 * kv_heads, "cross": 128 * kv_heads}


@pytest.mark.slow  # test_attention_impl keeps jax_nn in the quick run
def test_jax_nn_attention_composes_with_grouped_query_and_rope():
    config = TransformerConfig(**SMALL, positional="rope", num_kv_heads=2)
    model = Transformer(config)
    params = model.init(jax.random.key(0), SOURCE, TOKENS)
    fused = Transformer(config.replace(attention_impl="jax_nn"))
    np.testing.assert_allclose(
        fused.apply(params, SOURCE, TOKENS), model.apply(params, SOURCE, TOKENS), atol=1e-5
    )


# A model per option; test_grouped_query_equals_multi_head_with_repeated_kv_heads keeps
# both in the quick run.
@pytest.mark.slow
@pytest.mark.parametrize(
    "options",
    [{"scan_layers": True}, {"remat": True}, {"dtype": "bfloat16"}],
    ids=["scan", "remat", "bf16"],
)
def test_rope_and_grouped_query_compose(options):
    """A forward (and for remat a gradient) of each: scan and remat change no number."""
    base = TransformerConfig(**SMALL, positional="rope", num_kv_heads=2, norm="rmsnorm")
    reference = DecoderOnlyTransformer(base)
    params = nn.unbox(reference.init(jax.random.key(0), TOKENS))
    model = DecoderOnlyTransformer(base.replace(**options))
    if options.get("scan_layers"):
        decoder = dict(params["params"]["decoder"])
        layers = [decoder.pop(f"layers_{i}") for i in range(base.num_layers)]
        decoder["layers"] = jax.tree.map(lambda *xs: jnp.stack(xs), *layers)
        variables = {"params": {**params["params"], "decoder": decoder}}
    else:
        variables = params
    logits = model.apply(variables, TOKENS)
    assert logits.shape == (2, 7, 40) and logits.dtype == jnp.float32
    if options.get("dtype"):
        np.testing.assert_allclose(logits, reference.apply(params, TOKENS), atol=5e-2)
        return
    np.testing.assert_allclose(logits, reference.apply(params, TOKENS), rtol=1e-5, atol=1e-5)
    if options.get("remat"):

        def loss(p, m):
            return m.apply(p, TOKENS).mean()

        grad = jax.jit(jax.grad(loss), static_argnums=1)  # modules are hashable
        grads, ref_grads = grad(variables, model), grad(params, reference)
        jax.tree.map(
            lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), grads, ref_grads
        )
