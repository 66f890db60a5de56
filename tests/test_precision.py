"""Precision policy and attention-kernel choice.

bf16 compute keeps float32 parameters, optimizer state, norms, softmax, logits and loss; a
short bf16 training run tracks the float32 run. The `jax_nn` attention kernel (cuDNN flash
attention on NVIDIA GPUs) agrees with our vmapped XLA attention for every mask we use.
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import linen as nn

from flax_transformer import (
    DecoderOnlyTransformer,
    Transformer,
    TransformerConfig,
    label_smoothed_cross_entropy,
)

STEPS = 50
# Mean |loss_bf16 - loss_f32| over the run, relative to the float32 loss. bf16 keeps 8 bits
# of mantissa, so per-op relative errors are ~4e-3; through a 2-layer model and 50 Adam
# steps we allow 3%.
BF16_LOSS_TOLERANCE = 0.03


def _config(**changes):
    return TransformerConfig(
        vocab_size=48, d_model=32, num_heads=4, d_ff=64, num_layers=2, max_len=16, dropout_rate=0.0
    ).replace(**changes)


def _toy_batch(seed=0, batch=16, length=12, vocab=48):
    """Sequences whose next token is a fixed function of the current one: learnable fast."""
    rng = np.random.default_rng(seed)
    starts = rng.integers(3, vocab, (batch, 1))
    seq = (starts + 7 * np.arange(length + 1)[None, :]) % (vocab - 3) + 3
    seq[: batch // 4, -3:] = 0  # some right padding
    return jnp.asarray(seq[:, :-1], jnp.int32), jnp.asarray(seq[:, 1:], jnp.int32)


def _train(dtype: str):
    model = DecoderOnlyTransformer(_config(dtype=dtype))
    inputs, labels = _toy_batch()
    labels = jnp.where(inputs == 0, 0, labels)
    params = nn.unbox(model.init(jax.random.key(0), inputs))
    tx = optax.adam(3e-3)
    opt_state = tx.init(params)

    def loss_fn(p):
        logits = model.apply(p, inputs)
        per_token, weights = label_smoothed_cross_entropy(logits, labels, label_smoothing=0.1)
        return per_token.sum() / weights.sum(), logits

    # Traced once for all 50 steps: a retrace would mean a shape or dtype drifts.
    chex.clear_trace_counter()  # the counter keys on the code; each run starts afresh

    @jax.jit
    @chex.assert_max_traces(n=1)
    def step(p, o):
        (loss, logits), grads = jax.value_and_grad(loss_fn, has_aux=True)(p)
        updates, o = tx.update(grads, o, p)
        return optax.apply_updates(p, updates), o, loss, logits

    losses = []
    for _ in range(STEPS):
        params, opt_state, loss, logits = step(params, opt_state)
        losses.append(float(loss))
    return np.asarray(losses), params, opt_state, loss, logits


@pytest.fixture(scope="module")
def runs():
    return {dtype: _train(dtype) for dtype in ("float32", "bfloat16")}


@pytest.mark.slow  # a short bf16 run; test_models' bf16 test keeps bf16 in the quick run
def test_bf16_keeps_float32_params_optimizer_state_logits_and_loss(runs):
    _, params, opt_state, loss, logits = runs["bfloat16"]
    leaves = jax.tree.leaves(params) + [
        x for x in jax.tree.leaves(opt_state) if jnp.issubdtype(x.dtype, jnp.floating)
    ]
    assert leaves and {x.dtype for x in leaves} == {jnp.dtype(jnp.float32)}
    assert loss.dtype == jnp.float32 and logits.dtype == jnp.float32


def test_bf16_run_tracks_float32_run(runs):
    f32, bf16 = runs["float32"][0], runs["bfloat16"][0]
    assert f32[-1] < 0.5 * f32[0], "the toy task should be learned in 50 steps"
    relative = np.abs(bf16 - f32) / f32
    assert relative.mean() < BF16_LOSS_TOLERANCE, relative
    assert bf16[-1] < 0.5 * bf16[0]


def _both_impls(model_cls, params_args, call_args):
    xla = model_cls(_config())
    params = nn.unbox(xla.init(jax.random.key(1), *params_args))
    fused = model_cls(_config(attention_impl="jax_nn"))
    return xla.apply(params, *call_args), fused.apply(params, *call_args)


@pytest.mark.slow  # test_attention_impl keeps jax_nn masks in the quick run
def test_jax_nn_attention_matches_xla_with_padding_causal_and_cross_masks():
    src = jnp.asarray([[5, 6, 7, 8, 0, 0], [9, 10, 11, 12, 13, 14]], jnp.int32)
    tgt = jnp.asarray([[1, 20, 21, 0], [1, 22, 23, 24]], jnp.int32)
    ours, theirs = _both_impls(Transformer, (src, tgt), (src, tgt))
    real = np.asarray(tgt != 0)
    np.testing.assert_allclose(np.asarray(ours)[real], np.asarray(theirs)[real], atol=1e-5)
    ours, theirs = _both_impls(DecoderOnlyTransformer, (tgt,), (tgt,))
    np.testing.assert_allclose(np.asarray(ours)[real], np.asarray(theirs)[real], atol=1e-5)
