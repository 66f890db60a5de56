"""Sinusoidal positional encoding (seed 000, "PositionEncoding").

    PE[pos, 2i]   = sin(pos / base^(2i/D))
    PE[pos, 2i+1] = cos(pos / base^(2i/D))

Each (sin, cos) pair turns at its own frequency, like the gears of a water meter: early
dimensions change fast with position, late ones slowly. For a fixed offset k, PE[pos+k]
is a rotation of PE[pos] pair by pair, which lets attention read relative positions.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

# The base of the 2017 paper.
DEFAULT_BASE = 10000.0


def sinusoidal_positions(length: int, dim: int, base: float = DEFAULT_BASE) -> jax.Array:
    """The `(length, dim)` float32 table above, built by broadcasting (no Python loops).

    Args:
      length: number of positions (0..length-1).
      dim: model width D; must be even (one sin and one cos column per frequency).
      base: frequency base (10000 in the paper; the notes' example uses 100).
    """
    if length < 1:
        raise ValueError(f"sinusoidal_positions needs length >= 1, got {length}.")
    if dim < 2 or dim % 2:
        raise ValueError(f"sinusoidal_positions needs an even dim >= 2 (sin/cos pairs), got {dim}.")
    if base <= 0:
        raise ValueError(f"sinusoidal_positions needs base > 0, got {base}.")
    pos_L1 = jnp.arange(length, dtype=jnp.float32)[:, None]
    two_i = jnp.arange(0, dim, 2, dtype=jnp.float32)[None, :]
    angles_LP = pos_L1 / jnp.power(jnp.float32(base), two_i / dim)
    # Interleave: column 2i holds sin, column 2i+1 holds cos.
    return jnp.stack([jnp.sin(angles_LP), jnp.cos(angles_LP)], axis=-1).reshape(length, dim)
