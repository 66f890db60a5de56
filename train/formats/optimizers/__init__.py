"""The run's optimizer: a table of registered entries, each owning its options (its config
sub-section) and its builder, and the one place that builds from them (`make_optimizer`).

    registry.py        `Entry`, `register`, the table `OPTIMIZERS`, and `OptimizerConfig`,
                       the generic section (b1, b2, eps, weight_decay, clipping,
                       accumulation, fine-tuning groups) with the entry's options
    schedules.py       `SCHEDULES` ('rsqrt', 'cosine', 'constant'), `ScheduleConfig`,
                       `make_schedule`
    adam.py            'adam', 'adamw'
    muon.py            'muon': Muon for the layers' matrices, AdamW for the rest
    schedule_free.py   'schedule_free_adamw': evaluated at its averaged point
    lion.py            'lion' (Chen et al. 2023): the worked example of a new optimizer

A new optimizer is one module that registers an `Entry` (its options dataclass, if it has
any, and a builder) and its name in the import line below: docs/training.md, "Add an
optimizer". `train.config.sections` reads the table to check `--config.optimizer`; this
package imports nothing of the program above it (config, data, tasks, program, tools).

For fine-tuning, every parameter carries one label (`train.program.finetune.param_labels`)
and `make_optimizer` gives each label its transformation with `optax.multi_transform`:

    'train'       the full learning rate (new parameters, LoRA adapters)
    'pretrained'  `pretrained_lr_scale` of it
    'frozen'      not updated, no optimizer state (`optax.set_to_zero`)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import optax

# Each module registers its entries when imported: one name here per module.
from train.formats.optimizers import adam, lion, muon, schedule_free  # noqa: F401
from train.formats.optimizers.registry import (
    OPTIMIZERS,
    Entry,
    OptimizerConfig,
    config_section,
    register,
)
from train.formats.optimizers.schedules import (
    SCHEDULES,
    ScheduleConfig,
    make_schedule,
    schedule,
)

__all__ = [
    "OPTIMIZERS",
    "SCHEDULES",
    "Entry",
    "OptimizerConfig",
    "ScheduleConfig",
    "config_section",
    "evaluation_params",
    "make_optimizer",
    "make_schedule",
    "register",
    "schedule",
]


def _rates(schedule: ScheduleConfig, scale: float = 1.0):
    """The `Rate` an entry builds on: the run's schedule shape at a peak (None: the run's),
    times `scale` (a fine-tuning group's share)."""

    def rate(peak: float | None = None) -> optax.Schedule:
        shaped = make_schedule(schedule, peak)
        if scale == 1.0:
            return shaped
        return lambda count: scale * shaped(count)

    return rate


def make_optimizer(
    section: OptimizerConfig,
    schedule: ScheduleConfig,
    param_labels: Callable[[Any], Any] | None = None,
) -> optax.GradientTransformation:
    """The optax transformation of a run: clipping, then the entry's update rule.

    With `grad_accum_steps = k > 1`, `optax.MultiSteps` averages k micro-batch gradients
    and updates the parameters on every k-th call (the schedule counts updates, not calls).

    Args:
        section: the run's optimizer section (`experiment.optimizer`).
        schedule: the run's schedule section; the rule follows `make_schedule(schedule)`
            (and a part with a peak of its own, Muon's matrices, the same shape).
        param_labels: None (every parameter trains at the full rate), or a callable from
            the parameters to a tree of labels (`train.program.finetune.param_labels`):
            'train' at the full rate, 'pretrained' at `pretrained_lr_scale` of it, 'frozen'
            not updated and holding no optimizer state (`optax.multi_transform`). Frozen
            gradients are zeroed before clipping, so they do not count in its norm. Each
            group gets its own copy of the rule (Muon's split included).

    Returns:
        The transformation the train step applies (`train.program.steps`).

    Raises:
        ValueError: groups for an entry that takes none (schedule-free AdamW).
    """
    entry = section.entry
    if param_labels is None:
        opt = entry.build(section, section.options, _rates(schedule))
        if section.grad_clip_norm:
            opt = optax.chain(optax.clip_by_global_norm(section.grad_clip_norm), opt)
    else:
        if not entry.takes_groups:
            raise ValueError(
                f"--config.optimizer.name={entry.name!r} keeps one average of all the "
                "parameters and takes no fine-tuning groups (--config.init_from); use "
                f"one of {tuple(n for n, e in OPTIMIZERS.items() if e.takes_groups)}."
            )
        scale = section.pretrained_lr_scale
        groups = {
            "train": entry.build(section, section.options, _rates(schedule)),
            "pretrained": entry.build(section, section.options, _rates(schedule, scale)),
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


def evaluation_params(section: OptimizerConfig, opt_state: Any, params: Any) -> Any:
    """The parameters to evaluate, sample and export: `params`, unless the entry evaluates
    elsewhere (schedule-free AdamW: its averaged point, from `opt_state`). Jittable."""
    if section.entry.evaluation_params is None:
        return params
    return section.entry.evaluation_params(opt_state, params)
