"""The tasks a run can train, one folder each, and the registry that names them.

A new task is a folder here (its `Task` subclass: examples, batches, objective, evaluation)
and one entry in `TASKS`. Registering also gives the config's checks the task's facts as
plain values (`train.config.tasks.register_task`), so that config/, data/ and store/ never
import this package.
"""

from __future__ import annotations

from flax import linen as nn

from train.config.tasks import owners, register_task
from train.tasks.chat import ChatTask
from train.tasks.common.base import Encoded, Task
from train.tasks.dpo.task import DpoTask
from train.tasks.lm import LanguageModelTask
from train.tasks.translation import TranslationTask, drop_target_tokens

__all__ = [
    "TASKS",
    "ChatTask",
    "DpoTask",
    "Encoded",
    "LanguageModelTask",
    "Task",
    "TranslationTask",
    "drop_target_tokens",
    "get_task",
    "owners",
    "task_of",
]

# The registry: one entry a task.
TASKS: dict[str, Task] = {
    task.name: task for task in (TranslationTask(), LanguageModelTask(), ChatTask(), DpoTask())
}


def get_task(name: str) -> Task:
    """The registered task called `name`.

    Raises:
        ValueError: no task has that name (names the choices).
    """
    if name not in TASKS:
        raise ValueError(f"task={name!r} is not one of {tuple(TASKS)}.")
    return TASKS[name]


def task_of(model: nn.Module) -> Task:
    """The task that trains models of `model`'s kind (for code given a model, not a config).

    Raises:
        ValueError: no task trains such a model.
    """
    for task in TASKS.values():
        if isinstance(model, task.model_type):
            return task
    kinds = ", ".join(task.model_type.__name__ for task in TASKS.values())
    raise ValueError(f"{type(model).__name__} is not a model of any task; give one of {kinds}.")


for _task in TASKS.values():
    register_task(_task.facts())
