"""The run's optimizer, built from its checked sections: the learning-rate schedule
(`make_schedule`) and the optax transformation that follows it (`make_optimizer`).

`train.config.sections` checks the `schedule` and `optimizer` fields and holds them frozen;
this module turns them into optax objects, once, in `train.program.loop.build_program`. A new
optimizer is a new name in `sections.OPTIMIZERS` and one branch of `_update_rule`; a new
schedule a name in `sections.SCHEDULES` and one branch of `make_schedule`.

The update rules (`--config.optimizer`):

    'adam', 'adamw'        optax.adam / optax.adamw on `learning_rate`'s schedule
    'muon'                 the modded-nanogpt speedrun's split: `optax.contrib.muon` (momentum
                           orthogonalised by Newton-Schulz) for the hidden matrices, the
                           layers' attention and feed-forward kernels (`muon_labels`), on
                           `muon_learning_rate`'s schedule; optax.adamw (b1, b2, eps,
                           weight_decay, `learning_rate`) for the rest: embeddings, positions,
                           norms, biases, QK-norm scales and an untied head
    'schedule_free_adamw'  `optax.contrib.schedule_free_adamw` (Defazio et al. 2024): b1 is
                           its interpolation; it trains at one point of its averages (the
                           state's params) and is evaluated at another (`evaluation_params`)

For fine-tuning, every parameter carries one label (`train.program.finetune.param_labels`)
and `make_optimizer` gives each label its transformation with `optax.multi_transform`:

    'train'       the full learning rate (new parameters, LoRA adapters)
    'pretrained'  `pretrained_lr_scale` of it
    'frozen'      not updated, no optimizer state (`optax.set_to_zero`)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from optax.contrib import MuonDimensionNumbers, ScheduleFreeState

from train.config.sections import OptimizerConfig, ScheduleConfig

# Muon's matrices: the kernels of the layers' attention and feed-forward, by parameter
# name, with their (reduction, output) axes as stored, one layer (`layers_i`); under
# `nn.scan` (`layers`) a leading layer axis comes first. Every other axis is a batch axis
# that Muon orthogonalises apart (`optax.contrib.MuonDimensionNumbers`): the fused Q/K/V
# kernel is three matrices (D, N*H), one per part, and each layer of a scanned stack its
# own; the heads of a projection stay one matrix, as the speedrun's.
_MUON_KERNELS = {
    "qkv_kernel": ((0,), (2, 3)),  # (D, 3, N, H)
    "kv_kernel": ((0,), (2, 3)),  # (De, 2, K, H)
    "query_kernel": ((0,), (1, 2)),  # (D, N, H)
    "out_kernel": ((0, 1), (2,)),  # (N, H, D)
    "wi_kernel": ((0,), (1,)),  # (D, F)
    "wg_kernel": ((0,), (1,)),  # (D, F)
    "wo_kernel": ((0,), (1,)),  # (F, D)
}


def _names(path) -> tuple[str, ...]:
    """The dict keys of a tree path: the same for boxed parameters (`nn.Partitioned`, whose
    `.value` adds an attribute key) and unboxed ones, so the labels of init and update agree."""
    return tuple(str(k.key) for k in path if isinstance(k, jax.tree_util.DictKey))


def _muon_axes(path, leaf) -> MuonDimensionNumbers | None:
    """A hidden matrix's Muon axes (`_MUON_KERNELS`, after a scanned stack's layer axis), or
    None: not a matrix of the layers (AdamW's)."""
    names = _names(path)
    in_layers = any(n == "layers" or n.startswith("layers_") for n in names)
    if not names or names[-1] not in _MUON_KERNELS or not in_layers:
        return None
    reduction, output = _MUON_KERNELS[names[-1]]
    shift = jnp.ndim(leaf) - (max(*reduction, *output) + 1)  # 1 under nn.scan, else 0
    return MuonDimensionNumbers(
        tuple(a + shift for a in reduction), tuple(a + shift for a in output)
    )


def muon_dimension_numbers(params: Any) -> Any:
    """The tree `optax.contrib.muon` takes as `muon_weight_dimension_numbers`: each hidden
    matrix's `MuonDimensionNumbers`, None elsewhere (boxed or unboxed parameters, or the
    masked part of them a `multi_transform` group sees)."""
    return jax.tree_util.tree_map_with_path(_muon_axes, params)


def muon_labels(params: Any) -> Any:
    """'muon' for the hidden matrices (`muon_dimension_numbers`), 'adamw' for every other
    parameter: the labels of `--config.optimizer=muon`'s `optax.multi_transform`."""
    return jax.tree_util.tree_map_with_path(
        lambda path, leaf: "adamw" if _muon_axes(path, leaf) is None else "muon", params
    )


def make_schedule(section: ScheduleConfig, peak: float | None = None) -> optax.Schedule:
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
        peak: the rate at the end of warm-up; None: `section.learning_rate` (Muon's
            matrices follow the same shape to `--config.muon_learning_rate`).

    Returns:
        An optax schedule (update count -> learning rate).
    """
    peak = section.learning_rate if peak is None else peak
    warmup, kind, total = section.warmup_steps, section.schedule, section.num_updates

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
    section: OptimizerConfig,
    schedule: optax.Schedule,
    muon_schedule: optax.Schedule | None = None,
) -> optax.GradientTransformation:
    """The update rule `--config.optimizer` names (module docstring), on `schedule` (and
    Muon's matrices on `muon_schedule`)."""
    if section.optimizer == "adam":
        return optax.adam(schedule, b1=section.b1, b2=section.b2, eps=section.eps)
    if section.optimizer == "schedule_free_adamw":
        return optax.contrib.schedule_free_adamw(
            schedule,
            b1=section.b1,
            b2=section.b2,
            eps=section.eps,
            weight_decay=section.weight_decay,
        )
    adamw = optax.adamw(
        schedule, b1=section.b1, b2=section.b2, eps=section.eps, weight_decay=section.weight_decay
    )
    if section.optimizer == "adamw":
        return adamw
    if muon_schedule is None:  # 'muon'
        raise ValueError("optimizer='muon' needs a muon_schedule (make_optimizer's).")
    # Every parameter this group holds is a matrix, so optax's muon puts none in its own
    # Adam (which would be NAdam, with Muon's eps); the others get the config's AdamW.
    matrices = optax.contrib.muon(
        muon_schedule,
        beta=section.muon_momentum,
        weight_decay=section.muon_weight_decay,
        nesterov=True,
        muon_weight_dimension_numbers=muon_dimension_numbers,
    )
    return optax.multi_transform({"muon": matrices, "adamw": adamw}, muon_labels)


def evaluation_params(opt_state: Any, params: Any) -> Any:
    """The parameters to evaluate, sample and export: `params` themselves, except under
    'schedule_free_adamw', whose state's params are the point y where it takes gradients
    and whose evaluation point is x = (y - (1 - b1) z) / b1
    (`optax.contrib.schedule_free_eval_params`; the ScheduleFreeState is found wherever
    clipping or accumulation put it). Jittable.
    """
    found = [
        leaf
        for leaf in jax.tree.leaves(opt_state, is_leaf=lambda x: isinstance(x, ScheduleFreeState))
        if isinstance(leaf, ScheduleFreeState)
    ]
    if not found:
        return params
    return optax.contrib.schedule_free_eval_params(found[0], params)


def make_optimizer(
    section: OptimizerConfig,
    schedule: optax.Schedule,
    param_labels: Callable[[Any], Any] | None = None,
    *,
    muon_schedule: optax.Schedule | None = None,
) -> optax.GradientTransformation:
    """The optax transformation of a run: clipping, then the update rule on `schedule`.

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
            With 'muon', each group splits into Muon's matrices and AdamW's rest; with
            'schedule_free_adamw' groups are refused (one average of every parameter).
        muon_schedule: 'muon' only (required there): the matrices' rate,
            `make_schedule(..., peak=muon_learning_rate)`.

    Returns:
        The transformation the train step applies (`train.program.steps`).

    Raises:
        ValueError: 'muon' without `muon_schedule`, or 'schedule_free_adamw' with groups.
    """
    if param_labels is None:
        opt = _update_rule(section, schedule, muon_schedule)
        if section.grad_clip_norm:
            opt = optax.chain(optax.clip_by_global_norm(section.grad_clip_norm), opt)
    else:
        if section.optimizer == "schedule_free_adamw":
            raise ValueError(
                "--config.optimizer='schedule_free_adamw' keeps one average of all the "
                "parameters and takes no fine-tuning groups (--config.init_from); use "
                "'adam', 'adamw' or 'muon'."
            )
        scale = section.pretrained_lr_scale

        def scaled(rate):
            return None if rate is None else (lambda count: scale * rate(count))

        groups = {
            "train": _update_rule(section, schedule, muon_schedule),
            "pretrained": _update_rule(section, scaled(schedule), scaled(muon_schedule)),
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
