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

In bfloat16 and float16 a kept value `x * scale` must be rounded to the input's dtype, and
rounding alone biases the expectation by up to half a unit in the last place (bfloat16 at
rate 0.1: 1 is kept as 1.109375, not 1.1111, a mean of 0.9985). There the product is
computed in float32 and rounded once, and each element is kept with probability `x / kept`
(in units of 2**-16) instead of `1 / scale`, which makes the expectation `x` again; the keep
decisions then differ from `keep_mask`'s only on draws within about 2**-8 of the threshold.
float32 and float64 keep `keep_mask` and `x * scale` as they are (their rounding is far
below 2**-16).

Rate 1 drops everything and returns zeros, as `flax.linen.Dropout(1.0)` and torch do.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from flax_transformer.checks.arguments import check_floating, check_number

# Draws per element are 16-bit: rates are multiples of 2**-16.
_LEVELS = 1 << 16


def drop_threshold(rate: float, fn: str = "drop_threshold", name: str = "rate") -> int:
    """The 16-bit draw below which an element is dropped: `rate` in units of 2**-16.

    0 at rate 0, 2**16 (every draw) at rate 1, and otherwise within [1, 2**16 - 1], so a
    rate in (0, 1) never rounds to "none" or "all". `fn` and `name` say whose argument the
    rate is in the error for a rate outside [0, 1] (or not a finite number).
    """
    check_number(fn, name, rate, low=0.0, high=1.0)
    if rate == 0.0:
        return 0
    if rate == 1.0:
        return _LEVELS
    return min(max(round(rate * _LEVELS), 1), _LEVELS - 1)


def _draws(key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """uint32 draws in [0, 2**16) of `shape`, two per 32-bit word along the last axis."""
    if not shape:
        return jax.random.bits(key, (), jnp.uint32) & 0xFFFF
    *lead, last = shape
    words = jax.random.bits(key, (*lead, (last + 1) // 2), jnp.uint32)
    return jnp.concatenate([words & 0xFFFF, words >> 16], axis=-1)[..., :last]


def keep_mask(key: jax.Array, rate: float, shape: Sequence[int]) -> jax.Array:
    """Bool array of `shape`, True (keep) with probability `1 - drop_threshold(rate) / 2**16`.

    Args:
      key: a PRNG key (any `jax.random` implementation).
      rate: the probability of dropping, in [0, 1] (1: all False).
      shape: the shape of the mask; its last axis is drawn in pairs from 32-bit words.
    """
    threshold = drop_threshold(rate, "keep_mask")
    shape = tuple(int(d) for d in shape)
    if threshold == _LEVELS:
        return jnp.zeros(shape, jnp.bool_)
    return _draws(key, shape) >= threshold


def dropout(x: jax.Array, rate: float, key: jax.Array | None) -> jax.Array:
    """`x` with each element zeroed with probability `rate` (to 2**-16) and the others
    scaled so the expectation is `x`, in any float dtype (module docstring).

    Args:
      x: a floating array.
      rate: the probability of dropping, in [0, 1]; 1 returns zeros (as
        `flax.linen.Dropout`).
      key: a PRNG key; None returns `x` (as does rate 0).

    Raises:
      ValueError: a rate outside [0, 1] or not a finite number. TypeError: x not floating.
    """
    threshold = drop_threshold(rate, "dropout")
    if key is None or threshold == 0:
        return x
    check_floating("dropout", "x", x)
    if threshold == _LEVELS:
        return jnp.zeros_like(x)
    scale = _LEVELS / (_LEVELS - threshold)
    draws = _draws(key, jnp.shape(x))
    zero = jnp.zeros((), x.dtype)
    if jnp.finfo(x.dtype).bits >= 32:
        return jnp.where(draws >= threshold, x * jnp.asarray(scale, x.dtype), zero)
    # Narrower dtypes: the kept value rounded once, and kept with probability x / kept.
    x32 = x.astype(jnp.float32)
    kept = (x32 * np.float32(scale)).astype(x.dtype)
    kept32 = kept.astype(jnp.float32)
    exact = jnp.isfinite(kept32) & (kept32 != 0)  # else (0, NaN, inf) the plain threshold
    ratio = x32 / jnp.where(exact, kept32, 1.0)
    # How many of the 2**16 draws keep the element: round(2**16 x / kept), at most 2**16.
    keeps = jnp.where(exact, jnp.round(ratio * _LEVELS), float(_LEVELS - threshold))
    keep = draws.astype(jnp.float32) >= _LEVELS - keeps
    return jnp.where(keep, kept, zero)
