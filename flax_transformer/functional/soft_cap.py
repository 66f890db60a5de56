"""Logit soft-capping (Gemma 2, Team Gemma 2024, section 2; the modded-nanogpt speedrun)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from flax_transformer.checks.arguments import as_array, check_floating, check_number


def soft_cap(logits: jax.Array, cap: float | jax.Array) -> jax.Array:
    """`cap * tanh(logits / cap)`: every value squashed smoothly into (-cap, cap).

    Near 0 it is the identity (slope 1), so small logits keep their differences; large ones
    saturate, which keeps a confident model's logits (and their gradients) bounded.
    `cap = 0` means off: the logits come back unchanged (as `TransformerConfig.
    logits_soft_cap=0`), for a Python number and a traced one alike (`jit`, `vmap` over
    caps).

    Args:
      logits: any shape, floating; computed in its own dtype.
      cap: a finite number >= 0 (0: off), a Python number or a scalar array; a traced cap
        is allowed.

    Returns:
      The capped values, same shape and dtype.

    Raises:
      TypeError: logits are not floating, or cap is not a real number.
      ValueError: a concrete cap that is negative or not finite. A traced cap cannot be
        checked: a negative or non-finite one gives NaN everywhere (never numbers that
        look right).
    """
    logits = as_array("soft_cap", "logits", logits)
    check_floating("soft_cap", "logits", logits)
    cap = check_number("soft_cap", "cap", cap, low=0.0)
    if not isinstance(cap, jax.core.Tracer):  # a checked number: the formula, or nothing
        if cap == 0:
            return logits
        cap = jnp.asarray(cap, logits.dtype)
        return cap * jnp.tanh(logits / cap)
    cap = cap.astype(logits.dtype)
    on = cap > 0
    # Where the cap is off the division runs by 1, so neither the value nor the gradient
    # of the unused branch is 0 / 0.
    safe = jnp.where(on, cap, jnp.ones((), logits.dtype))
    capped = jnp.where(on, safe * jnp.tanh(logits / safe), logits)
    valid = (cap >= 0) & jnp.isfinite(cap)
    return jnp.where(valid, capped, jnp.full((), jnp.nan, logits.dtype))
