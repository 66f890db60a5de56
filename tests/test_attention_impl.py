"""The attention implementations behind `attention_impl`, against our reference formula.

Splash attention (a Pallas TPU kernel) runs here on the CPU in Pallas's interpret mode
(`attention_op.splash_interpret`), which is slow (seconds per call at T = 128): those
tests are few and marked slow. cuDNN needs a
GPU: its test runs only where one is present; elsewhere `'cudnn'` must refuse clearly.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flax_transformer import DecoderOnlyTransformer, MultiHeadAttention, TransformerConfig
from flax_transformer.functional import AttentionMask
from flax_transformer.functional.attention import grouped_heads_attention
from flax_transformer.functional.blocked_attention import blocked_attention
from flax_transformer.functional.dropout import drop_threshold, keep_mask
from flax_transformer.layers.attention_op import attention_op, splash_interpret

KEY = jax.random.key(24)
HAS_GPU = jax.default_backend() == "gpu"


def _qkv(batch, q_len, kv_len, heads, kv_heads, head_dim=64):
    kq, kk, kv = jax.random.split(KEY, 3)
    return (
        jax.random.normal(kq, (batch, q_len, heads, head_dim)),
        jax.random.normal(kk, (batch, kv_len, kv_heads, head_dim)),
        jax.random.normal(kv, (batch, kv_len, kv_heads, head_dim)),
    )


def _packed_ids(lengths, total):
    """Segment ids 1, 2, ... for runs of `lengths`, then padding (0) up to `total`."""
    ids = np.concatenate([np.full(n, i + 1) for i, n in enumerate(lengths)])
    return np.pad(ids, (0, total - len(ids))).astype(np.int32)


def _reference(q, k, v, mask):
    out, _ = grouped_heads_attention(q, k, v, mask, kv_head_axis=2)
    return out


def _loss(attend):
    # Every output, weighted so that each position's gradient differs.
    def loss(q, k, v):
        out = attend(q, k, v)
        return jnp.sum(out * jnp.sin(jnp.arange(out.size).reshape(out.shape)))

    return jax.value_and_grad(loss, argnums=(0, 1, 2))


# Decoder self-attention, packed (two examples and padding per row), grouped-query heads;
# right-padded causal self-attention; encoder self-attention with padding; packed
# cross-attention over a longer source.
SEG_A, SEG_B = _packed_ids([50, 60], 128), _packed_ids([128], 128)
CASES = {
    "causal_packed_gqa": (
        (2, 128, 128, 4, 2),
        lambda: AttentionMask(
            key_valid_BS=jnp.asarray(np.stack([SEG_A, SEG_B]) != 0),
            q_segments_BT=jnp.asarray(np.stack([SEG_A, SEG_B])),
            kv_segments_BS=jnp.asarray(np.stack([SEG_A, SEG_B])),
            causal=True,
        ),
    ),
    "causal_padding": (
        (2, 128, 128, 2, 2),
        lambda: AttentionMask(
            key_valid_BS=jnp.arange(128)[None, :] < jnp.array([[100], [128]]), causal=True
        ),
    ),
    "encoder_padding_mqa": (
        (2, 128, 128, 4, 1),
        lambda: AttentionMask(key_valid_BS=jnp.arange(128)[None, :] < jnp.array([[7], [128]])),
    ),
    "cross_packed": (
        (1, 128, 256, 2, 2),
        lambda: AttentionMask(
            key_valid_BS=jnp.asarray(_packed_ids([90, 100], 256) != 0)[None],
            q_segments_BT=jnp.asarray(SEG_A)[None],
            kv_segments_BS=jnp.asarray(_packed_ids([90, 100], 256))[None],
        ),
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_splash_matches_the_reference_forward_and_backward(case):
    shape, make_mask = CASES[case]
    q, k, v = _qkv(*shape)
    mask = make_mask()
    ref_value, ref_grads = _loss(lambda q, k, v: _reference(q, k, v, mask))(q, k, v)
    with splash_interpret():
        out, weights = attention_op(q, k, v, mask, impl="splash")
        value, grads = _loss(lambda q, k, v: attention_op(q, k, v, mask, impl="splash")[0])(q, k, v)
    assert weights is None
    chex.assert_trees_all_close(out, _reference(q, k, v, mask), atol=1e-5)
    np.testing.assert_allclose(value, ref_value, rtol=1e-5)
    for grad, ref in zip(grads, ref_grads, strict=True):
        chex.assert_trees_all_close(grad, ref, atol=1e-5)


@pytest.mark.slow
def test_a_splash_model_gives_the_logits_of_the_xla_model():
    config = TransformerConfig(
        vocab_size=40, d_model=64, num_heads=2, num_kv_heads=1, d_ff=64, num_layers=1,
        max_len=128, positional="rope", norm="rmsnorm", activation="swiglu", dropout_rate=0.0,
    )  # fmt: skip
    tokens = jax.random.randint(KEY, (2, 128), 1, 40).at[1, 90:].set(0)
    segments = jnp.asarray(np.stack([_packed_ids([70, 58], 128), _packed_ids([90], 128)]))
    xla = DecoderOnlyTransformer(config)
    params = xla.init(KEY, tokens)
    splash = DecoderOnlyTransformer(config.replace(attention_impl="splash"))
    for kwargs in ({}, {"segment_ids_BT": segments}):
        want = xla.apply(params, tokens, **kwargs)
        with splash_interpret():
            got = jax.jit(lambda p, t, kw=kwargs: splash.apply(p, t, **kw))(params, tokens)
        chex.assert_trees_all_close(got, want, atol=1e-5)


def test_jax_nn_takes_the_same_mask_arguments():
    """`jax.nn.dot_product_attention(implementation='xla')` through 'jax_nn', given the
    masks the models build, equals our reference (what splash is compared against too)."""
    for case in ("causal_padding", "encoder_padding_mqa"):
        shape, make_mask = CASES[case]
        q, k, v = _qkv(*(shape[:1]), 16, 16, *shape[3:], head_dim=8)
        mask = AttentionMask(
            key_valid_BS=make_mask().key_valid_BS[:, :16], causal=make_mask().causal
        )
        out, weights = attention_op(q, k, v, mask, impl="jax_nn")
        assert weights is None
        chex.assert_trees_all_close(out, _reference(q, k, v, mask), atol=1e-5)
    seg = jnp.asarray(_packed_ids([5, 6], 16))[None]
    q, k, v = _qkv(1, 16, 16, 4, 2, head_dim=8)
    packed = AttentionMask(seg != 0, seg, seg, causal=True)
    out, _ = attention_op(q, k, v, packed, impl="jax_nn")
    chex.assert_trees_all_close(out, _reference(q, k, v, packed), atol=1e-5)


def test_fused_kernels_refuse_what_they_cannot_do():
    q, k, v = _qkv(1, 128, 128, 2, 2, head_dim=8)
    mask = AttentionMask(causal=True)
    with pytest.raises(ValueError, match=r"attention_impl='splash' has no dropout"):
        attention_op(q, k, v, mask, impl="splash", dropout_rate=0.1, dropout_rng=KEY)
    with pytest.raises(ValueError, match=r"'splash' returns no attention weights"):
        attention_op(q, k, v, mask, impl="splash", need_weights=True)
    with pytest.raises(ValueError, match=r"takes the mask as an AttentionMask"):
        attention_op(q, k, v, jnp.tril(jnp.ones((128, 128), bool)), impl="splash")
    short = _qkv(1, 100, 100, 2, 2, head_dim=8)
    with pytest.raises(ValueError, match=r"multiples of\s+128.*T=100"):
        attention_op(*short, mask, impl="splash")
    with pytest.raises(ValueError, match=r"attention_impl='flash' is not one of"):
        attention_op(q, k, v, mask, impl="flash")
    with pytest.raises(ValueError, match=r"'splash' is a fused kernel with no dropout"):
        TransformerConfig(attention_impl="splash", attention_dropout_rate=0.1)
    # Through the layer: sowing weights needs 'xla'.
    x = jax.random.normal(KEY, (1, 128, 16))
    module = MultiHeadAttention(num_heads=2, impl="splash")
    params = jax.eval_shape(lambda: module.init(KEY, x, mask=mask))  # no kernel runs
    with pytest.raises(ValueError, match="returns no attention weights"):
        jax.eval_shape(lambda p: module.apply(p, x, mask=mask, mutable=["intermediates"]), params)


@pytest.mark.skipif(HAS_GPU, reason="checks the refusal where there is no GPU")
def test_cudnn_without_a_gpu_says_so():
    q, k, v = _qkv(1, 16, 16, 2, 2, head_dim=8)
    with pytest.raises(ValueError, match=r"'cudnn' runs cuDNN flash attention, which needs a GPU"):
        attention_op(q, k, v, AttentionMask(causal=True), impl="cudnn")


@pytest.mark.skipif(not HAS_GPU, reason="cuDNN flash attention needs a GPU")
def test_cudnn_matches_the_reference_on_a_gpu():
    seg = jnp.asarray(np.stack([_packed_ids([50, 60], 128), _packed_ids([128], 128)]))
    mask = AttentionMask(seg != 0, seg, seg, causal=True)
    q, k, v = (x.astype(jnp.bfloat16) for x in _qkv(2, 128, 128, 4, 2))
    out, _ = attention_op(q, k, v, mask, impl="cudnn")
    ref = _reference(*(x.astype(jnp.float32) for x in (q, k, v)), mask)
    real = np.asarray(seg != 0)[:, :, None, None]
    np.testing.assert_allclose(np.where(real, out.astype(jnp.float32), 0), ref, atol=2e-2)


@pytest.mark.parametrize("block", [48, 128])
@pytest.mark.parametrize("case", sorted(CASES))
def test_blocked_matches_the_reference_forward_and_backward(case, block):
    """The flash algorithm in jax.lax, over blocks that divide the keys (128) or not (48)."""
    shape, make_mask = CASES[case]
    q, k, v = _qkv(*shape)
    mask = make_mask()
    ref_value, ref_grads = _loss(lambda q, k, v: _reference(q, k, v, mask))(q, k, v)

    def blocked(q, k, v):
        return blocked_attention(
            q,
            k,
            v,
            key_valid_BS=mask.key_valid_BS,
            q_segments_BT=mask.q_segments_BT,
            kv_segments_BS=mask.kv_segments_BS,
            causal=mask.causal,
            block=block,
        )

    value, grads = jax.jit(_loss(blocked))(q, k, v)
    out, ref_out = blocked(q, k, v), _reference(q, k, v, mask)
    chex.assert_trees_all_close(out, ref_out, atol=1e-5)
    # The loss is a float32 sum of out.size weighted outputs that largely cancel (about 1.6
    # out of terms whose magnitudes add up to thousands): two summation orders of the same
    # terms may differ by eps * log2(n) * sum|terms| (pairwise summation's bound), which on
    # a CPU without AVX-512 exceeded a 1e-5 relative tolerance (2026-12-06, AMD EPYC:
    # 1.03e-5). The outputs themselves are compared element by element just above.
    terms = np.abs(np.asarray(ref_out) * np.sin(np.arange(ref_out.size).reshape(ref_out.shape)))
    bound = np.finfo(np.float32).eps * np.log2(ref_out.size) * terms.sum()
    assert abs(float(value) - float(ref_value)) <= max(bound, 1e-5 * abs(float(ref_value)))
    for grad, ref in zip(grads, ref_grads, strict=True):
        chex.assert_trees_all_close(grad, ref, atol=1e-5)


def _dropped_reference(q, k, v, mask, key, rate, block):
    """Attention with dropout Z on the softmax weights, Z drawn as blocked_attention draws
    it: block j's keep mask from fold_in(key, j), the blocks side by side."""
    b, t, n, h = q.shape
    s = k.shape[1]
    k, v = (jnp.repeat(x, n // x.shape[2], axis=2) for x in (k, v))
    scores = jnp.einsum("btnh,bsnh->bnts", q, k) / np.sqrt(h)
    dense = mask.dense(t, s)
    weights = jax.nn.softmax(jnp.where(dense, scores, -jnp.inf), axis=-1)
    weights = jnp.where(dense & jnp.any(dense, -1, keepdims=True), weights, 0.0)
    blocks = -(-s // block)
    keep = [keep_mask(jax.random.fold_in(key, j), rate, (b, n, t, block)) for j in range(blocks)]
    keep = jnp.concatenate(keep, axis=-1)[..., :s]
    scale = 65536 / (65536 - drop_threshold(rate))
    return jnp.einsum("bnts,bsnh->btnh", jnp.where(keep, weights * scale, 0.0), v)


@pytest.mark.parametrize("block", [48, 128])
@pytest.mark.parametrize("case", ["causal_packed_gqa", "causal_padding"])
def test_blocked_dropout_matches_the_reference_with_the_same_masks(case, block):
    """Dropout drawn per key block in both passes: forward and gradients equal attention with
    the same keep masks applied to the softmax weights."""
    shape, make_mask = CASES[case]
    q, k, v = _qkv(*shape)
    mask, key, rate = make_mask(), jax.random.key(7), 0.3
    ref_value, ref_grads = _loss(
        lambda q, k, v: _dropped_reference(q, k, v, mask, key, rate, block)
    )(q, k, v)

    def blocked(q, k, v):
        return blocked_attention(
            q, k, v, key_valid_BS=mask.key_valid_BS, q_segments_BT=mask.q_segments_BT,
            kv_segments_BS=mask.kv_segments_BS, causal=mask.causal, block=block,
            dropout_rate=rate, dropout_rng=key,
        )  # fmt: skip

    _, grads = jax.jit(_loss(blocked))(q, k, v)
    out = blocked(q, k, v)
    # Every output to 1e-5 (the loss, a sum over 65k of them, is compared through them).
    chex.assert_trees_all_close(out, _dropped_reference(q, k, v, mask, key, rate, block), atol=1e-5)
    assert not np.allclose(out, _reference(q, k, v, mask), atol=1e-3)  # dropout did act
    for grad, ref in zip(grads, ref_grads, strict=True):
        chex.assert_trees_all_close(grad, ref, atol=1e-5)


def test_blocked_dropout_keeps_the_expectation_and_runs_through_attention_op():
    q, k, v = _qkv(1, 64, 64, 2, 2, head_dim=16)
    mask, rate, draws = AttentionMask(causal=True), 0.5, 400
    attend = jax.jit(
        lambda key: attention_op(q, k, v, mask, impl="blocked", dropout_rate=rate, dropout_rng=key)[
            0
        ]
    )
    outs = np.stack([attend(jax.random.key(i)) for i in range(draws)])
    # Unbiased: the mean of the draws is within 5 standard errors of the undropped output.
    error = np.abs(outs.mean(0) - np.asarray(_reference(q, k, v, mask)))
    assert np.all(error <= 5 * outs.std(0) / np.sqrt(draws) + 1e-5)
    assert outs.std(0).max() > 0.1  # and the draws do differ
    with pytest.raises(ValueError, match="rate"):
        blocked_attention(q, k, v, causal=True, dropout_rate=1.0, dropout_rng=jax.random.key(0))


def test_blocked_through_attention_op_without_a_mask_and_with_dense_or_dropout():
    """No mask: plain attention; a dense mask or the weights: the reference runs."""
    q, k, v = _qkv(1, 40, 40, 2, 2, head_dim=16)
    out, weights = attention_op(q, k, v, None, impl="blocked")
    chex.assert_trees_all_close(out, _reference(q, k, v, None), atol=1e-5)
    assert weights is None
    dense = jnp.tril(jnp.ones((40, 40), bool))
    out, _ = attention_op(q, k, v, dense, impl="blocked")
    chex.assert_trees_all_close(out, _reference(q, k, v, dense), atol=1e-5)
    _, weights = attention_op(q, k, v, dense, impl="blocked", need_weights=True)
    assert weights is not None


def test_a_blocked_model_gives_the_logits_and_gradients_of_the_xla_model():
    config = TransformerConfig(
        vocab_size=40, d_model=64, num_heads=4, num_kv_heads=2, d_ff=64, num_layers=1,
        max_len=96, positional="learned", dropout_rate=0.0,
    )  # fmt: skip
    tokens = jax.random.randint(KEY, (2, 96), 1, 40).at[0, 90:].set(0).at[1, 70:].set(0)
    segments = jnp.asarray(np.stack([_packed_ids([50, 40], 96), _packed_ids([70], 96)]))
    xla = DecoderOnlyTransformer(config)
    params = xla.init(KEY, tokens)
    blocked = DecoderOnlyTransformer(config.replace(attention_impl="blocked"))
    for kwargs in ({}, {"segment_ids_BT": segments}):

        def loss(p, model, kw=kwargs):
            return jnp.sum(jnp.sin(model.apply(p, tokens, **kw)))

        want, want_grads = jax.value_and_grad(loss)(params, xla)
        got, got_grads = jax.jit(jax.value_and_grad(loss), static_argnums=1)(params, blocked)
        np.testing.assert_allclose(got, want, rtol=1e-5)
        chex.assert_trees_all_close(got_grads, want_grads, atol=1e-5)
