"""Each row's label log-probability through the head in blocks
(`functional.blocked_label_logps`), against the whole-logits reference of the DPO task
(`train.tasks.dpo.objective.sequence_logps`): values and gradients to float32 rounding, with
several blocks (the last one padded), one block, the added pad id left out or not, a bias and
a soft cap."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flax_transformer.functional import blocked_label_logps, soft_cap
from flax_transformer.functional.precision import mixed_einsum
from train.tasks.dpo.objective import sequence_logps

B, T, D, V = 3, 9, 8, 23
# float32 rounding of sums of 9 log-probabilities taken in another order.
RTOL, ATOL = 1e-5, 1e-5
# block_rows 6: 2 positions of the 3 rows a step, 5 steps, the last padded (T = 9);
# 1: one position a step; 64: one block, no scan.
BLOCK_ROWS = (6, 1, 64)


def _inputs(pad_id, seed=0):
    keys = jax.random.split(jax.random.key(seed), 4)
    hidden = jax.random.normal(keys[0], (B, T, D))
    head = jax.random.normal(keys[1], (D, V)) / np.sqrt(D)
    bias = 0.5 * jax.random.normal(keys[2], (V,))
    labels = np.array(jax.random.randint(keys[3], (B, T), 0, V - 1))
    labels[labels == pad_id] = 1  # a real label is never the pad id
    labels[0, :3] = pad_id  # a prompt
    labels[1, -4:] = pad_id  # padding at the end
    labels[2, :] = pad_id  # a row with nothing scored
    return hidden, head, bias, jnp.asarray(labels, jnp.int32)


def _whole(hidden, head, bias, labels, pad_id, *, drop, cap, use_bias):
    logits = mixed_einsum("btd,dv->btv", hidden, head, dtype=jnp.float32)
    if use_bias:
        logits = logits + bias
    if cap:
        logits = soft_cap(logits, cap)
    return sequence_logps(logits, labels, pad_id, drop_pad_logit=drop)


def _blocked(hidden, head, bias, labels, pad_id, *, drop, cap, use_bias, block_rows):
    sums = blocked_label_logps(
        hidden,
        head,
        labels,
        (labels != pad_id).astype(jnp.float32),
        block_rows=block_rows,
        num_scored_ids=pad_id if drop else None,
        bias_V=bias if use_bias else None,
        logits_soft_cap=cap,
    )
    return sums["logps"], sums["tokens"], sums["mean_logits"]


@pytest.mark.parametrize("block_rows", BLOCK_ROWS)
@pytest.mark.parametrize(
    "drop, cap, use_bias",
    [(False, 0.0, False), (True, 0.0, True), (True, 2.0, False), (False, 2.0, True)],
)
def test_equals_sequence_logps_of_whole_logits_values_and_gradients(
    block_rows, drop, cap, use_bias
):
    # The added pad id is the last id when it is left out; else id 0, a scored class.
    pad_id = V - 1 if drop else 0
    hidden, head, bias, labels = _inputs(pad_id)
    options = dict(drop=drop, cap=cap, use_bias=use_bias)
    want = _whole(hidden, head, bias, labels, pad_id, **options)
    got = jax.jit(lambda *x: _blocked(*x, pad_id, **options, block_rows=block_rows))(
        hidden, head, bias, labels
    )
    for name, w, g in zip(("logps", "tokens", "mean logits"), want, got, strict=True):
        assert g.shape == (B,) and g.dtype == jnp.float32, name
        np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL, err_msg=name)
    assert float(got[0][2]) == 0.0 and float(got[1][2]) == 0.0  # nothing scored

    # A different weight per row: a row's gradient mixed into another's would show.
    row_weights = jnp.asarray([1.0, -2.0, 3.0])

    def objective(compute):
        def f(hidden, head, bias):
            logps, _, mean_logits = compute(hidden, head, bias, labels, pad_id, **options)
            return (row_weights * logps).sum() + mean_logits.sum()

        return jax.grad(f, argnums=(0, 1, 2))(hidden, head, bias)

    want_grads = objective(_whole)
    got_grads = objective(lambda *x, **o: _blocked(*x, **o, block_rows=block_rows))
    for name, w, g in zip(("hidden", "head", "bias"), want_grads, got_grads, strict=True):
        np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL, err_msg=name)
    if not use_bias:
        assert not np.any(got_grads[2])
    if drop:  # the left-out id's column takes no gradient
        assert not np.any(got_grads[1][:, pad_id])


def test_mean_logits_carry_no_gradient():
    hidden, head, bias, labels = _inputs(0)

    def mean_logits(hidden, head):
        weights = (labels != 0).astype(jnp.float32)
        return blocked_label_logps(hidden, head, labels, weights, block_rows=6)["mean_logits"]

    assert np.any(mean_logits(hidden, head))
    grads = jax.grad(lambda *x: mean_logits(*x).sum(), argnums=(0, 1))(hidden, head)
    assert not any(np.any(g) for g in grads)


def test_scored_label_outside_the_scored_ids_is_nan_and_weights_multiply():
    hidden = jnp.ones((2, 4, 3))
    head = jnp.ones((3, 5))
    labels = jnp.asarray([[1, 4, 2, 99], [1, 1, 1, 99]])  # 4: outside 4 scored ids
    weights = jnp.asarray([[1.0, 1.0, 1.0, 0.0], [1.0, 2.0, 0.0, 0.0]])
    sums = blocked_label_logps(hidden, head, labels, weights, num_scored_ids=4, block_rows=2)
    assert np.isnan(float(sums["logps"][0]))
    # Equal logits: log p = -log 4 for every label; 99 sits on padding and costs nothing.
    np.testing.assert_allclose(float(sums["logps"][1]), -3 * np.log(4.0), rtol=1e-6)
    np.testing.assert_allclose(sums["tokens"], [3.0, 3.0])
    np.testing.assert_allclose(sums["mean_logits"], [9.0, 9.0], rtol=1e-6)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(block_rows=0), "block_rows"),
        (dict(num_scored_ids=6), "num_scored_ids=6 exceeds"),
        (dict(bias_V=jnp.zeros(4)), "bias_V"),
        (dict(logits_soft_cap=-1.0), "logits_soft_cap"),
    ],
)
def test_bad_arguments_are_refused_by_name(kwargs, match):
    args = (jnp.ones((1, 4, 3)), jnp.ones((3, 5)), jnp.zeros((1, 4), jnp.int32), jnp.ones((1, 4)))
    with pytest.raises(ValueError, match=f"blocked_label_logps: .*{match}"):
        blocked_label_logps(*args, **kwargs)
    with pytest.raises(ValueError, match="hidden_BTD must be"):
        blocked_label_logps(jnp.ones((4, 3)), jnp.ones((3, 5)), jnp.zeros(4, int), jnp.ones(4))
    with pytest.raises(TypeError, match="labels_BT must be int"):
        blocked_label_logps(args[0], args[1], jnp.zeros((1, 4)), args[3])
