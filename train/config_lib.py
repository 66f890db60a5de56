"""The experiment config (ml_collections, `configs/*.py`): its one check-and-convert into
sections (`train.sections.Experiment`), and what a resumed run must keep of it.

Every check names the field as it is written on the command line (`--config.field=value`),
so a bad override is fixed where it was made.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import ml_collections

from flax_transformer import TransformerConfig
from train.sections import PACKINGS, DataConfig, Experiment, RunConfig, model_config

__all__ = [
    "IDENTITY_FIELDS",
    "PACKINGS",
    "changed_identity_fields",
    "model_config",
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
    if "packing" not in saved:  # a config.json from before `packing` replaced `packed`
        saved = {**saved, "packing": "stream" if saved.get("packed") else "none"}
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
