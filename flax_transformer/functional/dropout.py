"""Dropout (Srivastava et al. 2014; the paper §5.4 "Residual Dropout") from 16 random bits
per element.

`jax.random.bernoulli` draws a float32 uniform for every element: one PRNG hash (threefry,
20 rounds) per element. A keep decision needs far fewer bits: here each hash gives 32 bits,
split into two 16-bit draws, so half the hashes are computed, and an element is kept when its
draw is at least `round(rate * 2**16)`. The rate used is therefore the nearest multiple of
2**-16 (0.1 -> 0.100006; a positive rate below 2**-17 becomes 2**-16, never 0), and the kept
elements are scaled by the inverse of that rate's keep probability, so the expectation of the
output is exactly the input. The draws keep the input's leading axes (only the last is
halved), so under `jax.jit` with sharded inputs each device draws its own rows.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp

from flax_transformer.checks.arguments import check_number

# Draws per element are 16-bit: rates are multiples of 2**-16.
_LEVELS = 1 << 16


def drop_threshold(rate: float) -> int:
    """The 16-bit draw below which an element is dropped: `rate` in units of 2**-16."""
    check_number("drop_threshold", "rate", rate, low=0.0, high=1.0, high_open=True)
    if rate == 0.0:
        return 0
    return min(max(round(rate * _LEVELS), 1), _LEVELS - 1)


def keep_mask(key: jax.Array, rate: float, shape: Sequence[int]) -> jax.Array:
    """Bool array of `shape`, True (keep) with probability `1 - drop_threshold(rate) / 2**16`.

    Args:
      key: a PRNG key (any `jax.random` implementation).
      rate: the probability of dropping, in [0, 1).
      shape: the shape of the mask; its last axis is drawn in pairs from 32-bit words.
    """
    threshold = drop_threshold(rate)
    shape = tuple(int(d) for d in shape)
    if not shape:
        words = jax.random.bits(key, (), jnp.uint32)
        return (words & 0xFFFF) >= threshold
    *lead, last = shape
    words = jax.random.bits(key, (*lead, (last + 1) // 2), jnp.uint32)
    draws = jnp.concatenate([words & 0xFFFF, words >> 16], axis=-1)[..., :last]
    return draws >= threshold


def dropout(x: jax.Array, rate: float, key: jax.Array | None) -> jax.Array:
    """`x` with each element zeroed with probability `rate` (to 2**-16) and the others
    scaled so the expectation is `x`; `x` itself when `key` is None or the rate is 0."""
    if key is None or rate == 0.0:
        return x
    threshold = drop_threshold(rate)
    scale = jnp.asarray(_LEVELS / (_LEVELS - threshold), x.dtype)
    keep = keep_mask(key, rate, jnp.shape(x))
    return jnp.where(keep, x * scale, jnp.zeros((), x.dtype))
