"""The optimizer: learning-rate schedule, clipping, Adam(W), optional gradient accumulation."""

from __future__ import annotations

import jax.numpy as jnp
import ml_collections
import optax


def learning_rate_schedule(config: ml_collections.ConfigDict) -> optax.Schedule:
    """Learning rate as a function of the optimizer update count (from 0).

    - 'rsqrt' (Vaswani et al. 2017, eq. 3, with the peak as a parameter): linear warm-up to
      `learning_rate` over `warmup_steps`, then `learning_rate * sqrt(warmup_steps / t)`.
      The paper's `d_model**-0.5 * min(t**-0.5, t * warmup**-1.5)` is this schedule with
      `learning_rate = (d_model * warmup_steps) ** -0.5`.
    - 'cosine': linear warm-up, then cosine decay to 0 at the last update.
    The first update (count 0) already gets `learning_rate / warmup_steps`, not 0.
    - 'constant': linear warm-up, then constant.

    Args:
        config: learning_rate, schedule, warmup_steps, num_train_steps, grad_accum_steps.

    Returns:
        An optax schedule (update count -> learning rate).
    """
    peak, warmup = config.learning_rate, config.warmup_steps
    total_updates = max(config.num_train_steps // config.grad_accum_steps, 1)

    def schedule(count):
        t = jnp.asarray(count, jnp.float32) + 1.0  # the update being made, from 1
        warm = jnp.minimum(t / warmup, 1.0) if warmup else 1.0
        if config.schedule == "constant":
            return peak * warm
        if config.schedule == "cosine":
            progress = jnp.clip((t - warmup) / max(total_updates - warmup, 1), 0.0, 1.0)
            return peak * warm * 0.5 * (1.0 + jnp.cos(jnp.pi * progress))
        decay = jnp.sqrt(max(warmup, 1) / jnp.maximum(t, max(warmup, 1)))
        return peak * warm * decay

    return schedule


def make_optimizer(config: ml_collections.ConfigDict) -> optax.GradientTransformation:
    """Global-norm clipping, then Adam or AdamW on the schedule; MultiSteps when accumulating.

    With `grad_accum_steps = k > 1`, `optax.MultiSteps` averages k micro-batch gradients and
    updates the parameters on every k-th call (the schedule counts updates, not calls).

    Args:
        config: optimizer, learning-rate and clipping fields of the experiment config.

    Returns:
        The optax transformation.
    """
    schedule = learning_rate_schedule(config)
    if config.optimizer == "adamw":
        opt = optax.adamw(
            schedule, b1=config.b1, b2=config.b2, eps=config.eps, weight_decay=config.weight_decay
        )
    else:
        opt = optax.adam(schedule, b1=config.b1, b2=config.b2, eps=config.eps)
    if config.grad_clip_norm:
        opt = optax.chain(optax.clip_by_global_norm(config.grad_clip_norm), opt)
    if config.grad_accum_steps > 1:
        opt = optax.MultiSteps(opt, every_k_schedule=config.grad_accum_steps)
    return opt
