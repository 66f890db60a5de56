"""What the programs that read a trained run share (train.translate, train.sample,
train.visualize): reading its config and checkpoint, and decoding options with the
program's flags checked as a training run checks its config.

Each ends the process with one line (`train.core.cli.die`) on a mistake: a usage error (no run
directory, a value out of range, a run of another task) exits with status 2, a run failure
(damaged config.json or checkpoints) with status 1. A tool reads the run's config first
(`read_experiment`), checks its flags against it (`decode_options`), and only then restores
the parameters (`load_run`), so a bad flag costs no restore and no decoding.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

from train.config import config_lib
from train.config.sections import DecodeOptionError, DecodeOptions, Experiment
from train.core.cli import die
from train.core.failures import RUN_ERROR, RunFailure
from train.program.trained import TrainedModel, load_trained
from train.tasks import get_task


def read_experiment(workdir: str | os.PathLike, tool: str | None = None) -> Experiment:
    """The checked sections of the run's config.json, or a one-line exit.

    Args:
        workdir: the run directory (`--workdir`).
        tool: the program asking ('train.translate', 'train.sample'), which must be the one of
            the run's task; None for a program that reads every task.
    """
    try:
        _, experiment = config_lib.read_saved(workdir)
    except RunFailure as err:  # a damaged config.json
        die(str(err), RUN_ERROR)
    except (FileNotFoundError, ValueError) as err:
        die(str(err))
    task = get_task(experiment.data.task)
    if tool is not None and task.tool != tool:
        die(
            f"{workdir} holds a task={task.name!r} model; use `python -m {task.tool}` for "
            f"{task.models}."
        )
    return experiment


def decode_options(options: DecodeOptions, flags: Mapping[str, tuple[str, Any]]) -> DecodeOptions:
    """`options` (the run's, `experiment.eval.decode`) with the values of the given flags.

    Each flag goes through the checks of `DecodeOptions`, those of the config field in
    training; a value out of range ends the process with `error: --<flag>=<value>: <what it
    must be>.` and status 2.

    Args:
        options: the run's decoding options.
        flags: flag name (as on the command line, without dashes) -> (the option it sets,
            its value); a value of None is a flag not given, which leaves the option as is.
    """
    given = {option: value for option, value in flags.values() if value is not None}
    try:
        return dataclasses.replace(options, **given)
    except DecodeOptionError as err:
        named = {option: flag for flag, (option, _) in flags.items()}
        die(str(err.named(f"--{named.get(err.option, err.option)}")))


def check_positive(flag: str, value: int | None) -> None:
    """A one-line exit unless `value` (of `--flag`; None = not given) is a positive integer."""
    if value is not None and value < 1:
        die(f"--{flag}={value!r}: must be a positive integer.")


def load_run(workdir: str | os.PathLike) -> TrainedModel:
    """`load_trained(workdir)`, or a one-line exit."""
    try:
        return load_trained(workdir)
    except RunFailure as err:  # damaged config.json or checkpoints
        die(str(err), RUN_ERROR)
    except (FileNotFoundError, ValueError) as err:
        die(str(err))
