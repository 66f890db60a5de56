"""The run's optimizer, built from its checked sections: the learning-rate schedule
(`make_schedule`) and the optax transformation that follows it (`make_optimizer`).

`train.config.sections` checks the `schedule` and `optimizer` fields and holds them frozen;
this module turns them into optax objects, once, in `train.train_lib.build_program`. A new
optimizer is a new name in `sections.OPTIMIZERS` and one branch of `_update_rule`; a new
schedule a name in `sections.SCHEDULES` and one branch of `make_schedule`.

For fine-tuning, every parameter carries one label (`train.program.finetune.param_labels`)
and `make_optimizer` gives each label its transformation with `optax.multi_transform`:

    'train'       the full learning rate (new parameters, LoRA adapters)
    'pretrained'  `pretrained_lr_scale` of it
    'frozen'      not updated, no optimizer state (`optax.set_to_zero`)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import optax

from train.config.sections import OptimizerConfig, ScheduleConfig


def make_schedule(section: ScheduleConfig) -> optax.Schedule:
    """Learning rate as a function of the optimizer update count (from 0).

    - 'rsqrt' (Vaswani et al. 2017, eq. 3, with the peak as a parameter): linear warm-up
      to `learning_rate` over `warmup_steps`, then `learning_rate * sqrt(warmup_steps / t)`.
      The paper's `d_model**-0.5 * min(t**-0.5, t * warmup**-1.5)` is this schedule with
      `learning_rate = (d_model * warmup_steps) ** -0.5`.
    - 'cosine': linear warm-up, then cosine decay to 0 at the last update.
    - 'constant': linear warm-up, then constant.
    The first update (count 0) already gets `learning_rate / warmup_steps`, not 0.

    Args:
        section: the run's schedule section (`experiment.schedule`).

    Returns:
        An optax schedule (update count -> learning rate).
    """
    peak, warmup, kind, total = (
        section.learning_rate,
        section.warmup_steps,
        section.schedule,
        section.num_updates,
    )

    def schedule(count):
        t = jnp.asarray(count, jnp.float32) + 1.0  # the update being made, from 1
        warm = jnp.minimum(t / warmup, 1.0) if warmup else 1.0
        if kind == "constant":
            return peak * warm
        if kind == "cosine":
            progress = jnp.clip((t - warmup) / max(total - warmup, 1), 0.0, 1.0)
            return peak * warm * 0.5 * (1.0 + jnp.cos(jnp.pi * progress))
        decay = jnp.sqrt(max(warmup, 1) / jnp.maximum(t, max(warmup, 1)))
        return peak * warm * decay

    return schedule


def _update_rule(
    section: OptimizerConfig, schedule: optax.Schedule
) -> optax.GradientTransformation:
    """The update rule `--config.optimizer` names ('adam' or 'adamw'), on `schedule`."""
    if section.optimizer == "adamw":
        return optax.adamw(
            schedule,
            b1=section.b1,
            b2=section.b2,
            eps=section.eps,
            weight_decay=section.weight_decay,
        )
    return optax.adam(schedule, b1=section.b1, b2=section.b2, eps=section.eps)


def make_optimizer(
    section: OptimizerConfig,
    schedule: optax.Schedule,
    param_labels: Callable[[Any], Any] | None = None,
) -> optax.GradientTransformation:
    """The optax transformation of a run: clipping, then Adam(W) on `schedule`.

    With `grad_accum_steps = k > 1`, `optax.MultiSteps` averages k micro-batch gradients
    and updates the parameters on every k-th call (the schedule counts updates, not calls).

    Args:
        section: the run's optimizer section (`experiment.optimizer`).
        schedule: the learning rate over updates (`make_schedule`).
        param_labels: None (every parameter trains at `schedule`), or a callable from
            the parameters to a tree of labels (`train.program.finetune.param_labels`):
            'train' at the full rate, 'pretrained' at `pretrained_lr_scale` of it, 'frozen'
            not updated and holding no optimizer state (`optax.multi_transform`). Frozen
            gradients are zeroed before clipping, so they do not count in its norm.

    Returns:
        The transformation the train step applies (`train.program.steps`).
    """
    if param_labels is None:
        opt = _update_rule(section, schedule)
        if section.grad_clip_norm:
            opt = optax.chain(optax.clip_by_global_norm(section.grad_clip_norm), opt)
    else:
        scale = section.pretrained_lr_scale
        groups = {
            "train": _update_rule(section, schedule),
            "pretrained": _update_rule(section, lambda count: scale * schedule(count)),
            "frozen": optax.set_to_zero(),
        }
        zero_frozen = optax.multi_transform(
            {
                "train": optax.identity(),
                "pretrained": optax.identity(),
                "frozen": optax.set_to_zero(),
            },
            param_labels,
        )
        parts = [zero_frozen]
        if section.grad_clip_norm:
            parts.append(optax.clip_by_global_norm(section.grad_clip_norm))
        opt = optax.chain(*parts, optax.multi_transform(groups, param_labels))
    if section.grad_accum_steps > 1:
        opt = optax.MultiSteps(opt, every_k_schedule=section.grad_accum_steps)
    return opt
