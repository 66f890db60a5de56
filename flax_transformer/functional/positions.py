"""Positions: the sinusoidal table (the paper §3.5; Happy-LLM ch. 2) and rotary embeddings.

    PE[pos, 2i]   = sin(pos / base^(2i/D))
    PE[pos, 2i+1] = cos(pos / base^(2i/D))

Each (sin, cos) pair turns at its own frequency, like the gears of a water meter: early
dimensions change fast with position, late ones slowly. For a fixed offset k, PE[pos+k]
is a rotation of PE[pos] pair by pair, which lets attention read relative positions.
Rotary embeddings (`apply_rope`) apply that rotation to the queries and keys themselves,
so the attention scores depend on relative positions only.
`segment_positions` numbers the tokens of packed sequences from 0 in each segment.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from flax_transformer.checks.arguments import check_floating, check_int, check_number

# The packing convention's positions live with the packing checks (`check_packing` returns
# them); re-exported here, where the other positions are.
from flax_transformer.checks.tokens import segment_positions as segment_positions

# The base of the 2017 paper.
DEFAULT_BASE = 10000.0


def sinusoidal_positions(length: int, dim: int, base: float = DEFAULT_BASE) -> jax.Array:
    """The `(length, dim)` float32 table above, built by broadcasting (no Python loops).

    Args:
      length: number of positions (0..length-1).
      dim: model width D; must be even (one sin and one cos column per frequency).
      base: frequency base, a finite number > 0 (10000 in the paper; small worked
        examples often use 100).

    Raises:
      TypeError: length or dim is not an int.
      ValueError: length < 1, dim odd or < 2, or base not a finite number > 0.
    """
    fn = "sinusoidal_positions"
    check_int(fn, "length", length, low=1)
    check_int(fn, "dim", dim, low=2)
    if dim % 2:
        raise ValueError(f"sinusoidal_positions needs an even dim >= 2 (sin/cos pairs), got {dim}.")
    check_number(fn, "base", base, low=0.0, low_open=True)
    pos_L1 = jnp.arange(length, dtype=jnp.float32)[:, None]
    two_i = jnp.arange(0, dim, 2, dtype=jnp.float32)[None, :]
    angles_LP = pos_L1 / jnp.power(jnp.float32(base), two_i / dim)
    # Interleave: column 2i holds sin, column 2i+1 holds cos.
    return jnp.stack([jnp.sin(angles_LP), jnp.cos(angles_LP)], axis=-1).reshape(length, dim)


# The rotary base of RoFormer (Su et al. 2021) and Llama 1/2; Llama 3 uses 500000.
DEFAULT_ROPE_BASE = 10000.0


def rope_angles(positions: jax.Array, head_dim: int, base: float = DEFAULT_ROPE_BASE) -> jax.Array:
    """float32 angles `(..., head_dim / 2)`: `positions * base^(-2i / head_dim)` for pair i.

    Args:
      positions: int or float positions of any shape.
      head_dim: H, the width the rotation acts on; must be even.
      base: frequency base (> 0, finite).
    """
    if head_dim < 2 or head_dim % 2:
        raise ValueError(f"rotary positions need an even head_dim >= 2, got {head_dim}.")
    if not (math.isfinite(base) and base > 0):
        raise ValueError(f"rotary positions need a finite base > 0, got {base!r}.")
    inv_freq_P = 1.0 / jnp.power(
        jnp.float32(base), jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim
    )
    return jnp.asarray(positions, jnp.float32)[..., None] * inv_freq_P


def apply_rope(
    x_TNH: jax.Array, positions_T: jax.Array, base: float = DEFAULT_ROPE_BASE
) -> jax.Array:
    """Rotary position embedding (RoPE, Su et al. 2021) of queries or keys.

    Feature pair i of each head, `(x[i], x[i + H/2])`, is rotated by the angle
    `position * base^(-2i/H)`:

        out[i]       = x[i] cos - x[i + H/2] sin
        out[i + H/2] = x[i + H/2] cos + x[i] sin

    This is the "rotate-half" layout of Hugging Face's Llama (`rotate_half`), not the
    interleaved pairs `(x[2i], x[2i+1])` of the RoFormer paper: the two are the same rotation
    after a fixed permutation of each head's features, and with this one the q/k kernels of
    a Hugging Face Llama checkpoint load without permuting their columns. Since every pair
    turns by an angle proportional to its position, `rope(q, m) . rope(k, n)` depends on
    m - n only: attention scores see relative positions.

    Args:
      x_TNH: queries or keys `(T, N, H)` (any leading axes, e.g. `(B, T, N, H)`); H even.
      positions_T: int positions `(T,)` (with the same leading axes, e.g. `(B, T)`).
      base: frequency base (DEFAULT_ROPE_BASE = 10000).

    Returns:
      The rotated `x`, same shape and dtype; the rotation runs in float32.
    """
    x_TNH = jnp.asarray(x_TNH)
    positions_T = jnp.asarray(positions_T)
    check_floating("apply_rope", "x_TNH", x_TNH)
    if x_TNH.ndim < 2 or positions_T.shape != x_TNH.shape[:-2]:
        raise ValueError(
            f"apply_rope needs x (..., T, N, H) and positions (..., T) with the same leading "
            f"axes, got {x_TNH.shape=}, {positions_T.shape=}."
        )
    half = x_TNH.shape[-1] // 2
    angles_TP = rope_angles(positions_T, x_TNH.shape[-1], base)[..., None, :]  # over heads
    cos_TP, sin_TP = jnp.cos(angles_TP), jnp.sin(angles_TP)
    x = x_TNH.astype(jnp.float32)
    x1, x2 = x[..., :half], x[..., half:]
    rotated = jnp.concatenate([x1 * cos_TP - x2 * sin_TP, x2 * cos_TP + x1 * sin_TP], axis=-1)
    return rotated.astype(x_TNH.dtype)
