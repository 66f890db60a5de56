"""A linear projection over merged rows: `x (..., D) @ w (D, *F) -> (..., *F)`."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from flax_transformer.functional import precision


def project(x: jax.Array, w: jax.Array) -> jax.Array:
    """Contract the last axis of `x` with the first of `w`, as one 2-D matmul.

    Same result as `jnp.tensordot(x, w, axes=1)`; written over merged rows `(prod(...), D)`
    and a merged kernel `(D, prod(F))` because XLA on CPU copies a transposed operand
    before a weight-gradient dot that contracts two axes (batch and time) and gives the
    2-D form none (benchmarks/RESULTS.md, "the copies' minimal reproduction").

    The product follows the mixed-precision policy (`functional.precision`): the operands
    as given (the caller casts them to the compute dtype), the sum and the result in
    float32 (float64 for float64 operands), not rounded back.

    Args:
      x: inputs `(..., D)`.
      w: kernel `(D, *F)`.

    Returns:
      `(..., *F)` in `precision.accumulation_dtype(x.dtype, w.dtype)`.
    """
    if x.ndim < 1 or w.ndim < 1:
        raise ValueError(f"project: x and w need at least one axis, got {x.shape=}, {w.shape=}")
    lead, width, features = x.shape[:-1], x.shape[-1], w.shape[1:]
    if w.shape[0] != width:
        raise ValueError(f"project: x has {width} features but w has {w.shape[0]} rows")
    rows = x.reshape(math.prod(lead), width)
    accumulate = precision.accumulation_dtype(rows.dtype, w.dtype)
    y = jnp.matmul(rows, w.reshape(width, math.prod(features)), preferred_element_type=accumulate)
    return y.reshape(*lead, *features)
