"""The experiment config (ml_collections, `configs/*.py`): its one check-and-convert into
sections (`train.sections.Experiment`), what a resumed run must keep of it, and the config a
run directory recorded (`read_saved`, for the tools that read a trained run).

Every check names the field as it is written on the command line (`--config.field=value`),
so a bad override is fixed where it was made.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

import ml_collections

from flax_transformer import TransformerConfig
from train.cli import DamagedFileError
from train.rundir import RunDir, read_json
from train.sections import PACKINGS, DataConfig, Experiment, RunConfig, model_config

__all__ = [
    "IDENTITY_FIELDS",
    "PACKINGS",
    "changed_identity_fields",
    "model_config",
    "read_saved",
    "validate_config",
]

# Fields that decide the data, vocabulary or parameter shapes: a resumed run must not change
# them (the checkpoint would not fit, or would silently continue a different experiment).
# They are the data section's (less its batch shapes), the model section, and the run's seed
# and PRNG.
IDENTITY_FIELDS = (*DataConfig.identity_fields(), *RunConfig.IDENTITY, "model")


def validate_config(config: ml_collections.ConfigDict) -> Experiment:
    """The config's sections, or ValueError for the first field out of range or inconsistent.

    Args:
        config: an experiment config (see `configs/default.py` for every field).

    Returns:
        The `Experiment` (frozen sections) the run reads.

    Raises:
        ValueError: names the field as `--config.<field>=<value>` and what it must be.
    """
    return Experiment.from_config(config)


def _renamed(saved: Mapping[str, Any]) -> dict[str, Any]:
    """A saved config with today's names: `packed` (a bool) became `packing`."""
    saved = dict(saved)
    if "packing" not in saved:  # a config.json from before `packing` replaced `packed`
        saved["packing"] = "stream" if saved.get("packed") else "none"
    return saved


def read_saved(
    workdir: str | os.PathLike,
) -> tuple[ml_collections.ConfigDict, Experiment]:
    """The config a run recorded in `workdir/config.json`, and its checked sections.

    A config.json written by an earlier version of the program lacks the fields added since:
    they take `configs/default.py`'s values, and a model field the model's default (as
    `changed_identity_fields` compares them); `packed` is read as today's `packing`.

    Args:
        workdir: a run directory written by `train.main`.

    Returns:
        (the config as the run wrote it, defaults filled in; `Experiment.from_config` of it).

    Raises:
        FileNotFoundError: no config.json in `workdir`.
        DamagedFileError: config.json is empty or not JSON (a RunFailure and a ValueError).
        ValueError: a recorded value fails today's checks; names config.json and the field.
    """
    from configs import default  # the package's own configs, imported only when needed

    run = RunDir(workdir)
    path = run.config
    if not path.exists():
        raise FileNotFoundError(
            f"{path} not found: {run.path} is not a training run directory ; train with "
            f"`python -m train.main --workdir {run.path}` first."
        )
    fix = (
        f"delete it and rerun `python -m train.main --workdir {run.path}` with the run's "
        "--config and overrides: it is rewritten and the run resumes"
    )
    saved = read_json(path, fix)
    if not isinstance(saved, dict):
        raise DamagedFileError(f"{path} holds no JSON object ; {fix}")
    saved = _renamed(saved)
    saved.pop("packed", None)
    config = ml_collections.ConfigDict({**default.get_config().to_dict(), **saved})
    try:
        return config, Experiment.from_config(config)
    except ValueError as err:
        raise ValueError(
            f"{path} records {err} ; correct the value in the file (this version of the "
            "program refuses it), or retrain."
        ) from None


def changed_identity_fields(
    saved: Mapping[str, Any], current: ml_collections.ConfigDict
) -> list[str]:
    """Fields in IDENTITY_FIELDS whose value differs between a saved config and this one.

    Args:
        saved: the config of an earlier run as a dict (`config.to_dict()`, via JSON).
        current: this run's config.

    Returns:
        Names like 'model.d_model' or 'vocab_size', empty when the run may resume.
    """
    now = current.to_dict()
    saved = _renamed(saved)
    # A model field that an older config.json lacks had the model's default then.
    model_defaults = {
        f.name: f.default
        for f in dataclasses.fields(TransformerConfig)
        if f.default is not dataclasses.MISSING
    }
    changed = []
    for field in IDENTITY_FIELDS:
        old, new = saved.get(field), now.get(field)
        if isinstance(new, dict):
            old = old or {}
            defaults = model_defaults if field == "model" else {}
            changed += [
                f"{field}.{k}"
                for k in sorted(set(old) | set(new))
                if old.get(k, defaults.get(k)) != new.get(k, defaults.get(k))
            ]
        elif old != new:
            changed.append(field)
    return changed
