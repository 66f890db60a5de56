"""The checks of a config as a whole, before its sections are made: finite numbers
everywhere (`check_finite`), no field under its old flat name (`check_renamed`), and what the
config's task accepts (`check_task`: its corpora and packings, no field or options section
that belongs to another task). `train.config.config_lib.validate_config` runs them first.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import ml_collections

from train.config.sections import PACKINGS, fail
from train.config.tasks import CONFIG_FIELD as TASKS_FIELD
from train.config.tasks import option_types, owners, registered_tasks
from train.core.cli import RENAMED_FIELDS
from train.formats import corpora


def check_task(config: ml_collections.ConfigDict) -> None:
    """What the config's task accepts: its corpora and packings, and no field that applies
    to another task only (which must stay 0).

    It runs before the data section is made, as these were the first checks of a field; a
    corpus or packing that no task knows is left to the section, which names the choices.
    """
    tasks = registered_tasks()
    if config.task not in tasks:
        raise fail("task", config.task, f"must be one of {tuple(tasks)}")
    task = tasks[config.task]
    if config.corpus in corpora.CORPORA and config.corpus not in task.corpora:
        raise fail("corpus", config.corpus, f"task={task.name!r} reads one of {task.corpora}")
    if config.packing in PACKINGS and config.packing not in task.packings:
        raise fail(
            "packing", config.packing, f"task={task.name!r} packs with one of {task.packings}"
        )
    if task.needs_pretrained and not config.get("init_from"):
        raise fail(
            "init_from",
            config.get("init_from", ""),
            f"task={task.name!r} fine-tunes a pretrained model that has a chat template (an "
            "Instruct model): --config.init_from=smollm2, a Hugging Face directory or a GGUF "
            "file, with --config.tokenizer=pretrained",
        )
    others = {f for other in tasks.values() for f in other.own_fields} - set(task.own_fields)
    for field in sorted(others):
        if config[field]:
            raise fail(field, config[field], f"applies to task={owners(field)} only; set it to 0")
    # Another task's own options section (`--config.tasks.<other>`) must stay at its defaults.
    given = config.get(TASKS_FIELD) or {}
    for name, kind in option_types().items():
        if name == task.name or not given.get(name):
            continue
        for f in dataclasses.fields(kind):
            value = given[name].get(f.name, f.default)
            if as_json(value) != as_json(f.default):
                raise fail(
                    f"{TASKS_FIELD}.{name}.{f.name}",
                    value,
                    f"applies to task={name!r} only (this run's task is {task.name!r}); leave "
                    f"it at {f.default!r}",
                )


def check_renamed(config: ml_collections.ConfigDict) -> None:
    """A config (a file, or code building one) that sets a field under its old flat name
    (`config.hf_dataset = ...`) is refused naming today's place: the old field would be
    read by nobody (the command line's old flags are translated, `train.core.cli`)."""
    for old, new in RENAMED_FIELDS.items():
        if old in config and not isinstance(config[old], ml_collections.ConfigDict):
            raise fail(old, config[old], f"is now --config.{new}; set that and delete {old}")


def check_finite(config: ml_collections.ConfigDict, prefix: str = "") -> None:
    """Raises ValueError for a NaN or infinite float anywhere in `config` (nested included).

    Range checks cannot catch these: every comparison with NaN is False.
    """
    for field, value in config.items():
        if isinstance(value, ml_collections.ConfigDict):
            check_finite(value, f"{prefix}{field}.")
        elif isinstance(value, float) and not math.isfinite(value):
            raise fail(f"{prefix}{field}", value, "must be a finite number")


def as_json(value: Any) -> Any:
    """A value as config.json gives it back: tuples become lists."""
    if isinstance(value, tuple | list):
        return [as_json(v) for v in value]
    return value
