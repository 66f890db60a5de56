"""`load_trained(workdir)` reads a finished (or running) run back for inference: its config
and the checked sections of it (`Experiment`), tokenizer, model and the newest parameters
that restore. Apart from the checkpointer, so that writing checkpoints does not import the
data pipeline and the tasks.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any, NamedTuple

import jax
import ml_collections
import orbax.checkpoint as ocp
from flax import linen as nn

from train.config import config_lib
from train.config.sections import Experiment
from train.core.rundir import RunDir
from train.data.tokenizer import Tokenizer
from train.data.tokenizers import run_tokenizer
from train.formats import optimizers as optim
from train.program.checkpoint import Checkpointer
from train.tasks import get_task


class TrainedModel(NamedTuple):
    """A trained run, ready for `train.tasks.common.inference.translate` / `sample_text`.

    Attributes:
        config: the run's config.json as a ConfigDict, fields added since it was written
            filled in (`config_lib.read_saved`).
        tokenizer: the run's tokenizer.
        model: the `Transformer` or `DecoderOnlyTransformer` of the run's model section.
        params: the newest parameters that restore, on device; of a run trained with
            schedule-free AdamW, its evaluation point (`optim.evaluation_params`), as the
            run itself evaluated.
        step: the step they were saved at.
        experiment: the checked sections of `config` (`train.config.sections.Experiment`); for
            example `experiment.eval.decode` is how the run decodes.
    """

    config: ml_collections.ConfigDict
    tokenizer: Tokenizer
    model: nn.Module
    params: Any
    step: int
    experiment: Experiment


def load_trained(workdir: str | os.PathLike) -> TrainedModel:
    """Reads `workdir/config.json`, the tokenizer and the latest checkpoint's parameters.

    The config passes the same section checks as a training run's (`config_lib.validate_config`).

    Args:
        workdir: a run directory written by `train.main`.

    Returns:
        The TrainedModel.

    Raises:
        FileNotFoundError: no config, tokenizer or checkpoint in `workdir`.
        CheckpointError: no checkpoint restores into the model of the saved config (a
            RunFailure: damaged files).
        DamagedFileError: config.json is empty or not JSON (a RunFailure and a ValueError).
        ValueError: a value of config.json fails today's checks (names the file and field).
    """
    run = RunDir(workdir)
    config, experiment = config_lib.read_saved(run.path)
    tokenizer = run_tokenizer(experiment.data.tokenizer, experiment.data.vocab_size, run)
    task = get_task(experiment.data.task)
    # As training builds it: the model section with the tokenizer's vocabulary.
    model = task.make_model(dataclasses.replace(experiment.model, vocab_size=tokenizer.vocab_size))
    # Only the parameters are read, into the shapes of a freshly initialised model.
    init_inputs = task.init_inputs()
    target = nn.unbox(jax.eval_shape(model.init, jax.random.key(0), *init_inputs))["params"]
    target = jax.tree.map(ocp.utils.to_shape_dtype_struct, target)
    targets = {"params": target}
    if experiment.optimizer.entry.evaluation_params is not None:
        # Its parameters are where it took gradients; the state's averages give the point
        # it evaluates (schedule-free AdamW; the run had no fine-tuning groups: its entry
        # refuses them).
        tx = optim.make_optimizer(experiment.optimizer, experiment.schedule)
        targets["opt_state"] = jax.eval_shape(tx.init, target)
    checkpointer = Checkpointer(run.path, read_only=True)
    try:
        parts, step = checkpointer.restore_parts(targets)
    finally:
        checkpointer.close()
    params = parts["params"]
    if "opt_state" in parts:
        evaluate = functools.partial(optim.evaluation_params, experiment.optimizer)
        params = jax.jit(evaluate)(parts["opt_state"], params)
    params = jax.device_put(params)  # on device once, not per call
    return TrainedModel(config, tokenizer, model, params, step, experiment)
