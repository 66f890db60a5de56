"""Attention masks. Convention: bool arrays, True where a query may attend to a key."""

from __future__ import annotations

import operator

import jax
import jax.numpy as jnp


def causal_mask(length: int) -> jax.Array:
    """Lower-triangular `(T, T)` mask: position t sees positions 0..t (seed 002)."""
    try:
        if isinstance(length, bool):
            raise TypeError
        length = operator.index(length)  # accepts numpy integers, rejects floats
    except TypeError:
        raise ValueError(f"causal_mask needs a positive int length, got {length!r}.") from None
    if length < 1:
        raise ValueError(f"causal_mask needs a positive int length, got {length!r}.")
    return jnp.tril(jnp.ones((length, length), dtype=jnp.bool_))


def padding_mask(tokens: jax.Array, pad_id: int = 0) -> jax.Array:
    """Key mask that hides padding tokens.

    Args:
      tokens: int token ids `(..., S)`.
      pad_id: the padding id.

    Returns:
      bool `(..., 1, S)`: True for real tokens. The singleton axis stands for the query
      axis, so the result broadcasts against `(..., T, S)` score matrices.
    """
    return (tokens != pad_id)[..., None, :]


def combine_masks(*masks: jax.Array | None) -> jax.Array | None:
    """Logical AND of masks broadcast together; `None` entries are skipped.

    Returns None when every mask is None (attend everywhere).
    """
    present = [m for m in masks if m is not None]
    if not present:
        return None
    out = present[0].astype(jnp.bool_)
    for m in present[1:]:
        out = jnp.logical_and(out, m.astype(jnp.bool_))
    return out
