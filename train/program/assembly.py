"""What a run compiles from its config before any parameter exists: the device mesh
(`make_mesh`), and the model, optimizer and jitted steps (`build_program` -> `Program`),
as `train_and_evaluate` runs them and `train.compile` compiles them ahead of time.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import jax
import optax
from flax import linen as nn

from flax_transformer import sharding as sharding_lib
from train.config.sections import Experiment
from train.data.batching import WHOLE_BATCH, RowShare
from train.formats import optimizers as optim
from train.program import finetune, steps
from train.tasks import Task


def make_mesh(
    mesh_shape: Sequence[int], devices: Sequence[jax.Device] | None = None
) -> jax.sharding.Mesh:
    """The `(data, fsdp, tensor)` mesh of `mesh_shape` (`--config.mesh_shape`, the run
    section's) over `devices` (default: all).

    Raises:
        ValueError: the sizes do not fill the devices (names --config.mesh_shape).
    """
    try:
        return sharding_lib.make_mesh(*mesh_shape, devices=devices)
    except ValueError as err:
        raise ValueError(f"--config.mesh_shape={tuple(mesh_shape)}: {err}") from None


@dataclasses.dataclass(frozen=True)
class Program:
    """What a run compiles from its config, before any parameter exists.

    Attributes:
        model: the flax module.
        tx: the optimizer.
        state_shapes: the TrainState's shapes and placement (`steps.train_state_shapes`).
        train_step: jitted `(state, batch) -> (state, metric sums)`; donates the state.
        eval_step: jitted `(params, batch) -> metric sums`.
        put_batch: places a numpy batch (this process's rows) on the mesh.
        eval_params: `state -> the parameters to evaluate` (`optim.evaluation_params`:
            the state's own, or where the optimizer's entry says (schedule-free AdamW's
            averaged point), jitted), for
            validation, BLEU and the final report.
    """

    model: nn.Module
    tx: optax.GradientTransformation
    state_shapes: steps.TrainState
    train_step: Callable
    eval_step: Callable
    put_batch: Callable
    eval_params: Callable = steps.state_params


def build_program(
    experiment: Experiment,
    task: Task,
    mesh: jax.sharding.Mesh,
    vocab_size: int,
    *,
    unk_id: int,
    share: RowShare = WHOLE_BATCH,
) -> Program:
    """The model, optimizer and jitted steps of `experiment` on `mesh`: what `train_and_evaluate`
    runs, and what `train.compile` compiles ahead of time for a TPU topology.

    The learning-rate schedule is built here, once: the optimizer follows it and the train
    step reports it (`learning_rate` in its metrics).

    Args:
        experiment: the run's config sections (`train.config.sections.Experiment`); its model,
            optimizer, schedule, step and run sections are read.
        task: its `train.tasks` Task.
        mesh: the device mesh (`make_mesh`).
        vocab_size: the tokenizer's vocabulary size.
        unk_id: the tokenizer's unknown id (the target of word dropout).
        share: this process's rows of each global batch.
    """
    run = experiment.run
    model = task.make_model(dataclasses.replace(experiment.model, vocab_size=vocab_size))
    schedule = optim.make_schedule(experiment.schedule)
    labels = (
        finetune.param_labels(experiment.optimizer, experiment.model)
        if experiment.data.init_from
        else None
    )
    tx = optim.make_optimizer(experiment.optimizer, experiment.schedule, labels)
    accum = experiment.optimizer.grad_accum_steps
    shapes = steps.train_state_shapes(model, task, tx, mesh, run.seed, run.rng_impl)
    train_step, eval_step, put_batch = steps.jit_steps(
        model,
        task,
        tx,
        shapes,
        mesh,
        label_smoothing=experiment.step.label_smoothing,
        rng_impl=run.rng_impl,
        target_token_dropout=experiment.step.target_token_dropout,
        unk_id=unk_id,
        share=share,
        learning_rate=lambda step: schedule(step // accum),  # micro-batch steps -> updates
        # An imported checkpoint's added pad id (the last) is no class of its softmax.
        drop_pad_logit=bool(experiment.data.init_from)
        and experiment.model.pad_id == vocab_size - 1,
        frozen=finetune.frozen_mask(experiment.optimizer, experiment.model) if labels else None,
    )
    eval_params = steps.state_params
    if experiment.optimizer.entry.evaluation_params is not None:
        eval_params = jax.jit(
            lambda state: optim.evaluation_params(
                experiment.optimizer, state.opt_state, state.params
            ),
            out_shardings=jax.tree.map(lambda leaf: leaf.sharding, shapes.params),
        )
    return Program(model, tx, shapes, train_step, eval_step, put_batch, eval_params)
