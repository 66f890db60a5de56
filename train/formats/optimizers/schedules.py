"""The learning rate over updates: the schedule table (`SCHEDULES`, one registered shape
per `--config.schedule`), its checked section (`ScheduleConfig`) and `make_schedule`.

Every schedule warms up linearly to the peak over `warmup_steps` updates; a shape says what
follows. A new schedule is one function `(rate at warm-up, t, warmup, total) -> rate`
registered with `@schedule('name')`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax.numpy as jnp
import optax

from train.core.failures import fail

# --config.schedule -> the rate after warm-up, as a function of the warm-up's rate
# (`peak * min(t / warmup, 1)`), the update t (from 1), warmup_steps and num_updates.
SCHEDULES: dict[str, Callable] = {}


def schedule(name: str) -> Callable[[Callable], Callable]:
    """Registers the decorated shape as `--config.schedule=name`."""

    def register(shape: Callable) -> Callable:
        SCHEDULES[name] = shape
        return shape

    return register


@schedule("rsqrt")
def _rsqrt(warm, t, warmup: int, total: int):
    """Vaswani et al. 2017, eq. 3, with the peak as a parameter: `peak * sqrt(warmup / t)`
    after warm-up. The paper's `d_model**-0.5 * min(t**-0.5, t * warmup**-1.5)` is this
    schedule with `learning_rate = (d_model * warmup_steps) ** -0.5`."""
    return warm * jnp.sqrt(max(warmup, 1) / jnp.maximum(t, max(warmup, 1)))


@schedule("cosine")
def _cosine(warm, t, warmup: int, total: int):
    """Cosine decay to 0 at the last update."""
    progress = jnp.clip((t - warmup) / max(total - warmup, 1), 0.0, 1.0)
    return warm * 0.5 * (1.0 + jnp.cos(jnp.pi * progress))


@schedule("constant")
def _constant(warm, t, warmup: int, total: int):
    """The peak, held."""
    return warm


@dataclasses.dataclass(frozen=True)
class ScheduleConfig:
    """The learning rate as a function of the optimizer update count.

    Attributes:
        schedule: a registered shape (`SCHEDULES`: 'rsqrt', 'cosine', 'constant').
        learning_rate: the peak rate, reached at the end of warm-up.
        warmup_steps: linear warm-up, in updates.
        num_updates: updates in the whole run (`num_train_steps // grad_accum_steps`, at least
            1): where the cosine reaches 0.
        fine_tuning: the run starts from pretrained weights (`--config.init_from`), where a
            learning rate of 0 is allowed (to evaluate and sample the pretrained model as is).
    """

    schedule: str
    learning_rate: float
    warmup_steps: int
    num_updates: int
    fine_tuning: bool = False

    @classmethod
    def from_config(cls, config, optimizer, run) -> ScheduleConfig:
        """The schedule's fields of the config; the update count from the optimizer and run
        sections, which have checked `grad_accum_steps` and `num_train_steps`."""
        return cls(
            schedule=config.schedule,
            learning_rate=config.learning_rate,
            warmup_steps=config.warmup_steps,
            num_updates=max(run.num_train_steps // optimizer.grad_accum_steps, 1),
            fine_tuning=bool(config.get("init_from")),
        )

    def __post_init__(self):
        if self.schedule not in SCHEDULES:
            raise fail("schedule", self.schedule, f"must be one of {tuple(SCHEDULES)}")
        warmup = self.warmup_steps
        if not isinstance(warmup, int) or isinstance(warmup, bool) or warmup < 0:
            raise fail("warmup_steps", warmup, "must be a non-negative integer")
        if self.learning_rate < 0:
            raise fail("learning_rate", self.learning_rate, "must be non-negative")
        if self.learning_rate == 0 and not self.fine_tuning:
            raise fail(
                "learning_rate",
                self.learning_rate,
                "must be > 0 (0 is allowed with --config.init_from, to evaluate a pretrained "
                "model unchanged)",
            )


def make_schedule(section: ScheduleConfig, peak: float | None = None) -> optax.Schedule:
    """Learning rate as a function of the optimizer update count (from 0): linear warm-up
    to the peak over `warmup_steps`, then the shape `section.schedule` names (`SCHEDULES`).
    The first update (count 0) already gets `peak / warmup_steps`, not 0.

    Args:
        section: the run's schedule section (`experiment.schedule`).
        peak: the rate at the end of warm-up; None: `section.learning_rate` (an optimizer
            part with a rate of its own, Muon's matrices, follows the same shape).

    Returns:
        An optax schedule (update count -> learning rate).
    """
    peak = section.learning_rate if peak is None else peak
    warmup, total = section.warmup_steps, section.num_updates
    shape = SCHEDULES[section.schedule]

    def rate(count):
        t = jnp.asarray(count, jnp.float32) + 1.0  # the update being made, from 1
        warm = jnp.minimum(t / warmup, 1.0) if warmup else 1.0
        return shape(peak * warm, t, warmup, total)

    return rate
