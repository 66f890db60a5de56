"""Schedule-free AdamW (Defazio et al. 2024, `optax.contrib.schedule_free_adamw`): the
generic b1 is its interpolation between its averages, in (0, 1). It replaces the decay of
the rate with averaging (so the schedule must be 'constant': warm-up, then constant), keeps
one average of every parameter (so it takes no fine-tuning groups), trains at one point
(the state's params, y) and is evaluated at another (`evaluation_params`, x). No options of
its own."""

from __future__ import annotations

from typing import Any

import jax
import optax
from optax.contrib import ScheduleFreeState

from train.core.failures import fail
from train.formats.optimizers.registry import Entry, register

NAME = "schedule_free_adamw"


def _build(section, options, rate) -> optax.GradientTransformation:
    return optax.contrib.schedule_free_adamw(
        rate(None), b1=section.b1, b2=section.b2, eps=section.eps, weight_decay=section.weight_decay
    )


def _check(section) -> None:
    if not 0 < section.b1 < 1:
        raise fail(
            "b1",
            section.b1,
            f"must be in (0, 1) with optimizer.name={NAME!r} (the interpolation between its "
            "averages; 0.9 is the paper's)",
        )


def _check_run(section, schedule, fine_tuning: bool) -> None:
    if schedule.schedule != "constant":
        raise fail(
            "schedule",
            schedule.schedule,
            f"optimizer.name={NAME!r} averages its iterates instead of decaying the rate: set "
            "--config.schedule=constant (linear warm-up, then constant)",
        )
    if fine_tuning:
        raise fail(
            "optimizer.name",
            NAME,
            "keeps one average of all the parameters and takes no fine-tuning groups "
            "(--config.init_from); use another optimizer",
        )


def evaluation_params(opt_state: Any, params: Any) -> Any:
    """x = (y - (1 - b1) z) / b1 (`optax.contrib.schedule_free_eval_params`), from the
    ScheduleFreeState wherever clipping or accumulation put it; `params` where there is
    none. Jittable."""
    found = [
        leaf
        for leaf in jax.tree.leaves(opt_state, is_leaf=lambda x: isinstance(x, ScheduleFreeState))
        if isinstance(leaf, ScheduleFreeState)
    ]
    if not found:
        return params
    return optax.contrib.schedule_free_eval_params(found[0], params)


SCHEDULE_FREE_ADAMW = register(
    Entry(
        NAME,
        _build,
        check=_check,
        check_run=_check_run,
        evaluation_params=evaluation_params,
        takes_groups=False,
    )
)
