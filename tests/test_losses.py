"""Tests for flax_transformer.functional.losses: label-smoothed cross-entropy."""

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from flax_transformer import label_smoothed_cross_entropy


def test_no_smoothing_is_negative_log_likelihood():
    logits = jax.random.normal(jax.random.key(0), (2, 5, 7))
    labels = jax.random.randint(jax.random.key(1), (2, 5), 1, 7)
    loss, weights = label_smoothed_cross_entropy(logits, labels, pad_id=None)
    expected = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    chex.assert_trees_all_close(loss, expected, atol=1e-6)
    chex.assert_trees_all_equal(weights, jnp.ones((2, 5)))


def test_golden_value_with_smoothing():
    # Uniform logits over V = 4: every -log p is log 4, so any smoothing gives log 4.
    loss, _ = label_smoothed_cross_entropy(
        jnp.zeros((1, 4)), jnp.array([2]), label_smoothing=0.1, pad_id=None
    )
    assert loss[0] == pytest.approx(math.log(4), rel=1e-6)
    # logits (0, ln 3): p = (1/4, 3/4). Label 1, eps = 0.2:
    # 0.8 * -log(3/4) + 0.2 * mean(-log(1/4), -log(3/4)).
    logits = jnp.array([[0.0, math.log(3.0)]])
    loss, _ = label_smoothed_cross_entropy(logits, jnp.array([1]), label_smoothing=0.2, pad_id=None)
    expected = 0.8 * -math.log(0.75) + 0.2 * 0.5 * (-math.log(0.25) - math.log(0.75))
    assert loss[0] == pytest.approx(expected, rel=1e-6)


def test_matches_optax_smooth_labels():
    logits = jax.random.normal(jax.random.key(2), (3, 11))
    labels = jnp.array([1, 4, 10])
    loss, _ = label_smoothed_cross_entropy(logits, labels, label_smoothing=0.1, pad_id=None)
    targets = optax.smooth_labels(jax.nn.one_hot(labels, 11), 0.1)
    chex.assert_trees_all_close(loss, optax.softmax_cross_entropy(logits, targets), atol=1e-5)


def test_padding_is_excluded_from_loss_and_count():
    logits = jax.random.normal(jax.random.key(3), (2, 4, 6))
    labels = jnp.array([[3, 2, 0, 0], [5, 0, 0, 0]])
    loss, weights = label_smoothed_cross_entropy(logits, labels, label_smoothing=0.1)
    np.testing.assert_array_equal(weights, [[1, 1, 0, 0], [1, 0, 0, 0]])
    np.testing.assert_array_equal(np.asarray(loss)[np.asarray(weights) == 0], 0.0)
    # Changing the logits at padded positions changes nothing.
    noisy = logits.at[:, 2:].add(100.0)
    loss2, _ = label_smoothed_cross_entropy(noisy, labels, label_smoothing=0.1)
    chex.assert_trees_all_close(loss.sum(), loss2.sum())


def test_float32_for_bfloat16_logits():
    loss, weights = label_smoothed_cross_entropy(
        jnp.zeros((2, 3), jnp.bfloat16), jnp.array([1, 2]), label_smoothing=0.1
    )
    assert loss.dtype == jnp.float32 and weights.dtype == jnp.float32


@pytest.mark.parametrize(
    "logits_shape, labels_shape, smoothing, match",
    [((2, 3, 5), (2, 4), 0.0, "same leading shape"), ((2, 5), (2,), 1.0, r"in \[0, 1\)")],
)
def test_bad_inputs(logits_shape, labels_shape, smoothing, match):
    with pytest.raises(ValueError, match=match):
        label_smoothed_cross_entropy(
            jnp.zeros(logits_shape), jnp.zeros(labels_shape, jnp.int32), label_smoothing=smoothing
        )
