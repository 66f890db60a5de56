"""Translation: the task, its objective (token cross-entropy) and its evaluation."""

from train.tasks.translation.task import TranslationTask, drop_target_tokens

__all__ = ["TranslationTask", "drop_target_tokens"]
