"""Chat fine-tuning: the task, its objective (token cross-entropy on the marked tokens) and its
evaluation."""

from train.tasks.chat.task import ChatTask

__all__ = ["ChatTask"]
