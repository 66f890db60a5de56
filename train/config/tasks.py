"""What the config's checks know of a task, as plain values: `TaskFacts`, registered by each
task folder (`train.tasks`) when it is imported, and looked up here by the task's name.

config/ sits below the tasks: it never imports them and names no task. The program, the
tools and the commands import `train.tasks`, which registers every task; code that checks a
config on its own (a notebook calling `validate_config`) gets the registry filled by a first
lookup, which imports `train.tasks` by name (`_load_tasks`).
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Mapping
from typing import Any

import ml_collections

from train.core import option_sections
from train.core.failures import fail
from train.core.option_sections import OptionSections

# The package whose import registers every task.
_TASKS_PACKAGE = "train.tasks"

# Where the tasks' own options live in the config: --config.tasks.<task>.<field>.
CONFIG_FIELD = "tasks"


@dataclasses.dataclass(frozen=True)
class TaskFacts:
    """A task's facts that the config sections and the data checks use.

    Attributes:
        name: the `config.task` value.
        corpora: the `config.corpus` values whose examples it reads.
        packings: the `config.packing` values it batches with.
        hf_fields: how many fields of a Hugging Face row make one example.
        own_fields: config fields that apply to this task only (0 / False for the others).
        file_corpus: the corpus its own validation and test files are read as.
        fine_tunes: whether a run may start from pretrained weights.
        needs_pretrained: whether a run must (its examples need the model's chat template).
        stores_masks: whether its examples carry a loss mask (a token store keeps it).
        reads_stores: whether a token store can feed it (`--config.store_dir`).
        verbatim: whether its text is kept verbatim by default (no whitespace collapsing).
        conversations: whether its examples are conversations (read through a chat template).
        options: the frozen dataclass of the options it owns, `--config.tasks.<name>.<field>`
            (None: it has none).
    """

    name: str
    corpora: tuple[str, ...]
    packings: tuple[str, ...]
    hf_fields: int
    own_fields: tuple[str, ...]
    file_corpus: str
    fine_tunes: bool = False
    needs_pretrained: bool = False
    stores_masks: bool = False
    reads_stores: bool = False
    verbatim: bool = False
    conversations: bool = False
    options: type | None = None


_REGISTERED: dict[str, TaskFacts] = {}


def register_task(facts: TaskFacts) -> None:
    """Makes `facts.name` a valid `config.task` (called by `train.tasks` on import)."""
    _REGISTERED[facts.name] = facts


def _load_tasks() -> dict[str, TaskFacts]:
    if not _REGISTERED:
        importlib.import_module(_TASKS_PACKAGE)
    return _REGISTERED


def registered_tasks() -> dict[str, TaskFacts]:
    """Every registered task's facts, by name."""
    return dict(_load_tasks())


def task_facts(name: str) -> TaskFacts:
    """The facts of the task called `name`.

    Raises:
        ValueError: no task has that name (`--config.task=...: must be one of (...)`).
    """
    tasks = _load_tasks()
    if name not in tasks:
        raise fail("task", name, f"must be one of {tuple(tasks)}")
    return tasks[name]


def owners(field: str) -> str:
    """The tasks a task-specific config field applies to, for messages: "'lm'"."""
    return " or ".join(
        repr(name) for name, facts in _load_tasks().items() if field in facts.own_fields
    )


class TaskOptions(OptionSections):
    """The options sections of every task that has options (`DataConfig.tasks`; frozen,
    hashable): `data.tasks.dpo` is the 'dpo' task's dataclass."""

    FIELD = CONFIG_FIELD
    OWNER = "task"
    __slots__ = ()


def option_error(task: str, field: str, value: Any, expected: str) -> ValueError:
    """The error for a bad task option: `--config.tasks.<task>.<field>=<value>: expected`."""
    return fail(f"{CONFIG_FIELD}.{task}.{field}", value, expected)


def option_types() -> dict[str, type]:
    """Each registered task's options dataclass, by task name (tasks without options left
    out)."""
    return {name: f.options for name, f in _load_tasks().items() if f.options is not None}


def config_section() -> ml_collections.ConfigDict:
    """`config.tasks` of a config file: every task's options at their defaults (override
    them after, e.g. `config.tasks.dpo.beta = 0.2`)."""
    return option_sections.config_section(option_types())


def read_task_options(section: Mapping[str, Any] | None) -> TaskOptions:
    """The run's task options from the config's `tasks` section (a mapping; a section or
    field it lacks takes its default).

    Raises:
        ValueError: a bad option or an unknown field, named as `--config.tasks.<t>.<f>`.
    """
    return option_sections.read_sections(TaskOptions, option_types(), section)
