"""Logit soft-capping (Gemma 2, Team Gemma 2024, section 2; the modded-nanogpt speedrun)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from flax_transformer.checks.arguments import as_array, check_floating, check_number


def soft_cap(logits: jax.Array, cap: float) -> jax.Array:
    """`cap * tanh(logits / cap)`: every value squashed smoothly into (-cap, cap).

    Near 0 it is the identity (slope 1), so small logits keep their differences; large ones
    saturate, which keeps a confident model's logits (and their gradients) bounded.

    Args:
      logits: any shape, floating; computed in its own dtype.
      cap: a finite number > 0.

    Returns:
      The capped values, same shape and dtype.

    Raises:
      TypeError: logits are not floating, or cap is not a real number.
      ValueError: cap is not a finite number > 0.
    """
    logits = as_array("soft_cap", "logits", logits)
    check_floating("soft_cap", "logits", logits)
    cap = jnp.asarray(check_number("soft_cap", "cap", cap, low=0.0, low_open=True), logits.dtype)
    return cap * jnp.tanh(logits / cap)
