"""train.program.optim: the schedule and the optax optimizer built from the checked sections.

The paper's schedule (eq. 3) is pinned on `configs/transformer_base.py` in
tests/test_config_files.py, and the rate each step reports in tests/test_sections.py; here
the builders alone, on small trees.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from train.config.sections import OptimizerConfig, ScheduleConfig
from train.program import optim

PARAMS = {"embed": jnp.full((3,), 0.5), "new": jnp.full((2,), -0.5), "old": jnp.full((2,), 1.0)}
GRADS = {
    "embed": jnp.full((3,), 100.0),
    "new": jnp.array([3.0, -4.0]),
    "old": jnp.array([3.0, -4.0]),
}
GROUPS = {"embed": "frozen", "new": "train", "old": "pretrained"}


def _optimizer(**fields):
    values = dict(
        optimizer="adamw", b1=0.9, b2=0.98, eps=1e-9, weight_decay=0.0, grad_clip_norm=0.0
    )
    values.update(grad_accum_steps=1, freeze="", pretrained_lr_scale=1.0)
    values.update(fields)
    return OptimizerConfig(**values)


def _updates(tx, grads=GRADS, params=PARAMS):
    updates, _ = tx.update(grads, tx.init(params), params)
    return jax.tree.map(np.asarray, updates)


@pytest.mark.parametrize(
    "kind, rates",
    [
        ("constant", [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]),
        ("rsqrt", [0.25, 0.5, 0.75, 1.0, (4 / 5) ** 0.5, (4 / 6) ** 0.5]),
        ("cosine", [0.25, 0.5, 0.75, 1.0, 0.5, 0.0]),
    ],
)
def test_each_schedule_warms_up_linearly_from_the_first_update(kind, rates):
    schedule = optim.make_schedule(ScheduleConfig(kind, 1.0, warmup_steps=4, num_updates=6))
    got = [float(schedule(count)) for count in range(6)]
    np.testing.assert_allclose(got, rates, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("kind", ["adam", "adamw"])
def test_without_groups_it_is_clipping_then_the_named_rule(kind):
    section = _optimizer(optimizer=kind, weight_decay=0.1, grad_clip_norm=1.0)
    rule = optax.adamw(1e-3, 0.9, 0.98, 1e-9, weight_decay=0.1) if kind == "adamw" else None
    rule = rule or optax.adam(1e-3, 0.9, 0.98, 1e-9)
    expected = optax.chain(optax.clip_by_global_norm(1.0), rule)
    got = _updates(optim.make_optimizer(section, lambda count: 1e-3))
    jax.tree.map(np.testing.assert_array_equal, got, _updates(expected))


def test_groups_freeze_scale_and_clip_without_the_frozen_gradients():
    section = _optimizer(eps=1.0, grad_clip_norm=1.0, pretrained_lr_scale=0.5)
    tx = optim.make_optimizer(section, lambda count: 1e-2, lambda params: GROUPS)
    got = _updates(tx)
    np.testing.assert_array_equal(got["embed"], 0.0)  # frozen
    # Adam's first step is -lr * g / (|g| + eps), g clipped to global norm 1: the norm of the
    # 'new' and 'old' gradients alone (sqrt(50)), the frozen 100s not counted.
    clipped = np.array([3.0, -4.0]) / np.sqrt(50.0)
    step = clipped / (np.abs(clipped) + 1.0)
    np.testing.assert_allclose(got["new"], -1e-2 * step, rtol=1e-6)
    np.testing.assert_allclose(got["old"], -0.5e-2 * step, rtol=1e-6)  # half the rate
    moments = [x.size for x in jax.tree.leaves(tx.init(PARAMS)) if np.ndim(x)]
    assert sum(moments) == 2 * (2 + 2)  # mu and nu of 'new' and 'old'; none for 'embed'


def test_accumulation_updates_on_every_kth_call_with_the_mean_gradient():
    section = _optimizer(optimizer="adam", grad_accum_steps=2)
    tx = optim.make_optimizer(section, lambda count: 1e-2)
    state = tx.init(PARAMS)
    first, state = tx.update(GRADS, state, PARAMS)
    assert all(not np.any(x) for x in jax.tree.leaves(first))
    twice = jax.tree.map(lambda g: 3 * g, GRADS)
    second, _ = tx.update(twice, state, PARAMS)
    mean = jax.tree.map(lambda g: 2 * g, GRADS)
    plain = _updates(optim.make_optimizer(_optimizer(optimizer="adam"), lambda count: 1e-2), mean)
    jax.tree.map(np.testing.assert_allclose, jax.tree.map(np.asarray, second), plain)
