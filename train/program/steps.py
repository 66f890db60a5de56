"""Train state, the jitted train and eval steps, and their data-parallel placement (the
optimizer and its schedule are built by their config sections, `train.config.sections`).

Data parallelism goes through `jax.sharding`: a mesh over all devices
(`flax_transformer.sharding.make_mesh`), the batch split along its rows, parameters and
optimizer state placed by the logical-axis rules (replicated on a pure data mesh). On one
device all of this is a no-op. The step functions sum over the whole (global) batch, so the
loss is the same whatever the number of devices.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import flax
import jax
import jax.numpy as jnp
import optax
from flax import linen as nn

from flax_transformer import sharding as sharding_lib
from train.data.batching import WHOLE_BATCH, RowShare
from train.data.tokenizer import UNK_ID
from train.tasks import Task
from train.tasks.common.objective import LossSetup


@flax.struct.dataclass
class TrainState:
    """Everything that changes during training; checkpointed as one pytree.

    Attributes:
        step: int32 scalar, micro-batch steps done.
        params: the model parameters (unboxed).
        opt_state: the optax state.
        rng: uint32 raw key data of the dropout PRNG; split once per step.
    """

    step: jax.Array
    params: Any
    opt_state: Any
    rng: jax.Array


def state_params(state: TrainState) -> Any:
    """The state's own parameters: what every optimizer but schedule-free AdamW evaluates
    (`train.formats.optimizers.evaluation_params`)."""
    return state.params


def _boxed_init(model: nn.Module, task: Task, tx, seed: int, rng_impl: str):
    """The function computing the step-0 TrainState, parameters still boxed with their
    logical axis names."""

    def init_boxed() -> TrainState:
        variables = model.init(jax.random.key(seed), *task.init_inputs())
        dropout_key = jax.random.fold_in(jax.random.key(seed, impl=rng_impl), 1)
        return TrainState(
            step=jnp.zeros((), jnp.int32),
            params=variables["params"],
            opt_state=tx.init(variables["params"]),
            rng=jax.random.key_data(dropout_key),
        )

    return init_boxed


def train_state_shapes(
    model: nn.Module,
    task: Task,
    tx: optax.GradientTransformation,
    mesh: jax.sharding.Mesh,
    seed: int,
    rng_impl: str,
) -> TrainState:
    """The TrainState's shapes, dtypes and placement on `mesh`, without computing it.

    Parameters carry logical axis names; optimizer moments built from them inherit the names,
    so both are placed by `flax_transformer.sharding.model_rules` (replicated on a pure data
    mesh). Scalars and the PRNG key are replicated. `jit_steps` accepts this in place of a
    real state (ahead-of-time compilation, `train.compile`).

    Args:
        model, task, tx, mesh, seed, rng_impl: as in `create_train_state`.

    Returns:
        A TrainState of `jax.ShapeDtypeStruct` leaves, each with its NamedSharding.
    """
    boxed = jax.eval_shape(_boxed_init(model, task, tx, seed, rng_impl))
    rules = sharding_lib.model_rules(getattr(model, "config", None), mesh)
    shardings = nn.logical_to_mesh_sharding(nn.get_partition_spec(boxed), mesh, rules)
    # A multi_transform optimizer (fine-tuning groups) holds `optax.MaskedNode`s, empty
    # tuples that flax reads as partition specs: they stay as they are.
    return jax.tree.map(
        lambda leaf, sharding: (
            leaf
            if isinstance(leaf, optax.MaskedNode)
            else jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding)
        ),
        nn.unbox(boxed),
        shardings,
        is_leaf=lambda x: isinstance(x, optax.MaskedNode),
    )


def create_train_state(
    model: nn.Module,
    task: Task,
    tx: optax.GradientTransformation,
    mesh: jax.sharding.Mesh,
    seed: int,
    rng_impl: str,
    *,
    pretrained: Any = None,
) -> TrainState:
    """Initial state, created directly in its placement on the mesh (one compiled program).

    The placement is `train_state_shapes`'s.

    Args:
        model: the flax module.
        task: the run's task (its init inputs).
        tx: the optimizer.
        mesh: the device mesh.
        seed: parameter init uses key(seed); dropout uses fold_in(key(seed), 1).
        rng_impl: the PRNG implementation of the dropout key.
        pretrained: None, or a nested dict of parameters (a subtree of the model's, e.g.
            all but LoRA adapters) that replace the initial ones. Each is placed with its
            parameter's sharding before the program runs, and the random values it replaces
            are never computed (XLA drops what no output uses).

    Returns:
        The TrainState at step 0, each leaf with its NamedSharding.

    Raises:
        ValueError: a pretrained parameter the model does not have, or of another shape.
    """
    shapes = train_state_shapes(model, task, tx, mesh, seed, rng_impl)
    shardings = jax.tree.map(lambda leaf: leaf.sharding, shapes)
    init_boxed = _boxed_init(model, task, tx, seed, rng_impl)
    rules = sharding_lib.model_rules(getattr(model, "config", None), mesh)
    if pretrained is None:
        init = sharding_lib.on_mesh(lambda: nn.unbox(init_boxed()), mesh, rules)
        return jax.jit(init, out_shardings=shardings)()
    want = flax.traverse_util.flatten_dict(shapes.params)
    loaded = flax.traverse_util.flatten_dict(pretrained)
    for path, value in loaded.items():
        if path not in want or tuple(value.shape) != want[path].shape:
            expected = want[path].shape if path in want else "no such parameter"
            raise ValueError(
                f"pretrained parameter {'/'.join(path)} {tuple(value.shape)} does not fit the "
                f"model ({expected})."
            )
    placed = {
        path: jax.device_put(jnp.asarray(value, want[path].dtype), want[path].sharding)
        for path, value in loaded.items()
    }

    def init_from(placed):
        state = nn.unbox(init_boxed())
        params = flax.traverse_util.flatten_dict(state.params)
        params.update(placed)
        params = flax.traverse_util.unflatten_dict(params)
        return state.replace(params=params, opt_state=tx.init(params))

    init = sharding_lib.on_mesh(init_from, mesh, rules)
    return jax.jit(init, out_shardings=shardings, donate_argnums=0)(placed)


def _trained_grads(loss_fn, params, frozen_mask):
    """`jax.value_and_grad(loss_fn, has_aux=True)(params)`, differentiated with respect to
    the parameters `frozen_mask` leaves trained only; a frozen one's gradient is zeros."""
    leaves, treedef = jax.tree.flatten(params)
    mask = treedef.flatten_up_to(frozen_mask)
    trained = [leaf for leaf, is_frozen in zip(leaves, mask, strict=True) if not is_frozen]

    def of_trained(trained):
        it = iter(trained)
        whole = [
            leaf if is_frozen else next(it) for leaf, is_frozen in zip(leaves, mask, strict=True)
        ]
        return loss_fn(jax.tree.unflatten(treedef, whole))

    value, trained_grads = jax.value_and_grad(of_trained, has_aux=True)(trained)
    it = iter(trained_grads)
    grads = [
        jnp.zeros_like(leaf) if is_frozen else next(it)
        for leaf, is_frozen in zip(leaves, mask, strict=True)
    ]
    return value, jax.tree.unflatten(treedef, grads)


def train_step(
    state: TrainState,
    batch: dict[str, jax.Array],
    *,
    model: nn.Module,
    task: Task,
    tx: optax.GradientTransformation,
    label_smoothing: float,
    rng_impl: str,
    target_token_dropout: float = 0.0,
    unk_id: int = UNK_ID,
    learning_rate: Callable[[jax.Array], jax.Array] | None = None,
    drop_pad_logit: bool = False,
    frozen: Callable[[Any], Any] | None = None,
) -> tuple[TrainState, dict[str, jax.Array]]:
    """One micro-batch: forward, the task's objective (`Task.loss`: label-smoothed token
    cross-entropy for the tasks with a vocabulary head, the mean over the batch's scored
    tokens), gradient, optimizer update.

    Args:
        state: the TrainState.
        batch: int32 `(B, L)` arrays ('src', 'tgt_in', 'tgt_out' or 'inputs', 'targets').
        model, task, tx, label_smoothing, rng_impl: bound with functools.partial.
        target_token_dropout: word-dropout rate of the task's decoder inputs
            (translation only; 0 = off).
        unk_id: the id that dropped decoder inputs become.
        learning_rate: the rate of this step's update as a function of the micro-batch
            steps done before it (`state.step`); reported in the metrics when given.
        drop_pad_logit: the pad id is an id added after the vocabulary (an imported
            checkpoint, `train.data.hf_tokenizer`): its logit, the last, is left out of the
            softmax, so the loss is the checkpoint's own over its V ids.
        frozen: parameters -> a tree of bools, True where a parameter is not trained (the
            fine-tuning group 'frozen': every pretrained weight under LoRA); the gradient is
            taken of the others only, so the backward pass computes no weight gradient of a
            frozen matrix (a third of a layer's matmuls), and the frozen ones get zeros.

    Returns:
        (new state, the objective's metric sums (token cross-entropy: loss, nll, correct,
        tokens); grad_norm and learning_rate of this step).
    """
    key = jax.random.wrap_key_data(state.rng, impl=rng_impl)
    key, dropout_key = jax.random.split(key)
    if target_token_dropout:
        # A key of its own, derived without changing the dropout key stream of rate-0 runs.
        word_key = jax.random.fold_in(dropout_key, 1)
        batch = task.drop_decoder_inputs(
            batch, target_token_dropout, word_key, unk_id=unk_id, pad_id=model.config.pad_id
        )

    setup = LossSetup(model.config.pad_id, label_smoothing, drop_pad_logit)

    def loss_fn(params):
        return task.loss(
            model, params, batch, setup, deterministic=False, rngs={"dropout": dropout_key}
        )

    mask = None if frozen is None else frozen(state.params)
    if mask is None or not any(jax.tree.leaves(mask)):
        (_, sums), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    else:
        (_, sums), grads = _trained_grads(loss_fn, state.params, mask)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = dict(sums)
    metrics["grad_norm"] = optax.tree.norm(grads)
    if learning_rate is not None:
        metrics["learning_rate"] = jnp.asarray(learning_rate(state.step), jnp.float32)
    new_state = state.replace(
        step=state.step + 1,
        params=params,
        opt_state=opt_state,
        rng=jax.random.key_data(key),
    )
    return new_state, metrics


def eval_step(
    params: Any,
    batch: dict[str, jax.Array],
    *,
    model: nn.Module,
    task: Task,
    drop_pad_logit: bool = False,
) -> dict[str, jax.Array]:
    """Metric sums of one validation batch (`Task.eval_sums`), without label smoothing or
    dropout (`drop_pad_logit` as in `train_step`).

    Returns:
        The task's sums; token cross-entropy: {'loss', 'nll', 'correct', 'tokens'} summed
        over non-padding target tokens ('loss' equals 'nll' here).
    """
    return task.eval_sums(model, params, batch, LossSetup(model.config.pad_id, 0.0, drop_pad_logit))


def jit_steps(
    model: nn.Module,
    task: Task,
    tx: optax.GradientTransformation,
    state: TrainState,
    mesh: jax.sharding.Mesh,
    *,
    label_smoothing: float,
    rng_impl: str,
    target_token_dropout: float = 0.0,
    unk_id: int = UNK_ID,
    share: RowShare = WHOLE_BATCH,
    learning_rate: Callable[[jax.Array], jax.Array] | None = None,
    drop_pad_logit: bool = False,
    frozen: Callable[[Any], Any] | None = None,
) -> tuple[Callable, Callable, Callable]:
    """The jitted train and eval steps, and a function placing a numpy batch on the mesh.

    The train step donates the state (its buffers are reused for the new state).

    Args:
        state: the TrainState, or its `train_state_shapes` (only its shardings are read).
        share: the rows of each global batch that this process's numpy batches hold
            (`train.core.distributed.batch_row_share`); all of them in a single process.
        label_smoothing, rng_impl, target_token_dropout, unk_id, learning_rate,
            drop_pad_logit, frozen: as in `train_step`.

    Returns:
        (train_step(state, batch), eval_step(params, batch), put_batch(numpy batch)).
    """
    state_shardings = jax.tree.map(lambda x: x.sharding, state)
    batch_sharding = sharding_lib.batch_sharding(mesh)
    replicated = sharding_lib.replicated(mesh)
    rules = sharding_lib.model_rules(getattr(model, "config", None), mesh)
    train = jax.jit(
        sharding_lib.on_mesh(
            functools.partial(
                train_step,
                model=model,
                task=task,
                tx=tx,
                label_smoothing=label_smoothing,
                rng_impl=rng_impl,
                target_token_dropout=target_token_dropout,
                unk_id=unk_id,
                learning_rate=learning_rate,
                drop_pad_logit=drop_pad_logit,
                frozen=frozen,
            ),
            mesh,
            rules,
        ),
        in_shardings=(state_shardings, batch_sharding),
        out_shardings=(state_shardings, replicated),
        donate_argnums=0,
    )
    evaluate = jax.jit(
        sharding_lib.on_mesh(
            functools.partial(eval_step, model=model, task=task, drop_pad_logit=drop_pad_logit),
            mesh,
            rules,
        ),
        in_shardings=(state_shardings.params, batch_sharding),
        out_shardings=replicated,
    )

    def put_batch(batch):
        # This process's rows straight to its devices' shards; with several processes the
        # parts join into one global (B, L) array without any process holding all of it.
        return {
            key: jax.make_array_from_process_local_data(
                batch_sharding, rows, (rows.shape[0] * share.count, *rows.shape[1:])
            )
            for key, rows in batch.items()
        }

    return train, evaluate, put_batch
