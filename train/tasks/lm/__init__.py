"""Language modelling: the task, its objective (token cross-entropy) and its evaluation."""

from train.tasks.lm.task import LanguageModelTask

__all__ = ["LanguageModelTask"]
