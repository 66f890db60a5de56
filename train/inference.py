"""Load a trained run for inference: its config, tokenizer, model and latest parameters."""

from __future__ import annotations

import os
from typing import Any, NamedTuple

import jax
import ml_collections
import orbax.checkpoint as ocp
from flax import linen as nn

from train import config_lib, input_pipeline
from train.checkpoint import Checkpointer
from train.rundir import RunDir, read_json
from train.tasks import get_task
from train.tokenizer import Tokenizer


class TrainedModel(NamedTuple):
    """A trained run, ready for `train.decoding.translate` / `sample_text`."""

    config: ml_collections.ConfigDict
    tokenizer: Tokenizer
    model: nn.Module
    params: Any
    step: int


def load_trained(workdir: str | os.PathLike) -> TrainedModel:
    """Reads `workdir/config.json`, the tokenizer and the latest checkpoint's parameters.

    Args:
        workdir: a run directory written by `train.main`.

    Returns:
        The TrainedModel.

    Raises:
        FileNotFoundError: no config, tokenizer or checkpoint in `workdir`.
        CheckpointError: no checkpoint restores into the model of the saved config (a
            RunFailure: damaged files).
        DamagedFileError: config.json is empty or not JSON (a RunFailure and a ValueError).
    """
    run = RunDir(workdir)
    workdir, config_path = run.path, run.config
    if not config_path.exists():
        raise FileNotFoundError(
            f"{config_path} not found: {workdir} is not a training run directory ; train with "
            f"`python -m train.main --workdir {workdir}` first."
        )
    saved = read_json(
        config_path,
        f"delete it and rerun `python -m train.main --workdir {workdir}` with the run's "
        "--config and overrides: it is rewritten and the run resumes",
    )
    config = ml_collections.ConfigDict(saved)
    tokenizer = input_pipeline.make_tokenizer(config, run)
    task = get_task(config.task)
    model = task.make_model(config_lib.model_config(config, tokenizer.vocab_size))
    # Only the parameters are read, into the shapes of a freshly initialised model.
    init_inputs = task.init_inputs()
    target = nn.unbox(jax.eval_shape(model.init, jax.random.key(0), *init_inputs))["params"]
    target = jax.tree.map(ocp.utils.to_shape_dtype_struct, target)
    checkpointer = Checkpointer(workdir, read_only=True)
    try:
        params, step = checkpointer.restore_params(target)
    finally:
        checkpointer.close()
    params = jax.device_put(params)  # on device once, not per call
    return TrainedModel(config, tokenizer, model, params, step)
