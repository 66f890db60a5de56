"""When a run stops early: divergence (a step whose loss or gradient norm is NaN/inf stops the
run with the step named, before a bad state can be checkpointed) and the targets
`--config.target_valid_loss` / `--config.target_bleu` (`Target`)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from train.core.failures import RunFailure


class TrainingDivergedError(RunFailure):
    """The loss (or the parameters) became NaN or infinite."""


def check_finite(steps: Sequence[int], fetched: Sequence[Mapping], checkpointer) -> None:
    """Stops the run at the first of `steps` whose fetched loss or gradient norm is not finite.

    Args:
        steps: the step numbers, one per entry of `fetched`.
        fetched: each step's metrics on the host ('loss', 'grad_norm', ...).
        checkpointer: the run's Checkpointer, whose last kept step the message names.

    Raises:
        TrainingDivergedError: naming the step, its loss and gradient norm, the last
            checkpoint kept, and the settings to change before rerunning.
    """
    for step, metrics in zip(steps, fetched, strict=True):
        if not (
            math.isfinite(float(metrics["loss"])) and math.isfinite(float(metrics["grad_norm"]))
        ):
            last = checkpointer.latest_step()
            kept = f"step {last}" if last is not None else "none saved yet"
            raise TrainingDivergedError(
                f"Training diverged at step {step}: loss={float(metrics['loss'])}, "
                f"grad_norm={float(metrics['grad_norm'])}. The last good checkpoint "
                f"({kept}) is kept in {checkpointer.directory}. Lower "
                "--config.learning_rate, raise --config.warmup_steps or set "
                "--config.grad_clip_norm, then rerun (it resumes from that checkpoint)."
            )


class Target:
    """`--config.target_valid_loss` / `--config.target_bleu`: whether an evaluation reached
    one, and where (the first that did)."""

    def __init__(self, valid_loss: float = 0.0, bleu: float = 0.0):
        """Args: the run section's targets; 0 = none."""
        self.valid_loss, self.bleu = valid_loss, bleu
        self.reached: dict | None = None

    def check(self, metric: str, value: float, step: int, wall_s: float) -> bool:
        """Records and returns whether `value` of `metric` ('valid_loss': at most the target;
        'bleu': at least) reaches a target not reached before."""
        threshold = self.valid_loss if metric == "valid_loss" else self.bleu
        if not threshold or self.reached is not None:
            return False
        if value <= threshold if metric == "valid_loss" else value >= threshold:
            self.reached = {"metric": metric, "value": value, "step": step, "wall_s": wall_s}
            return True
        return False

    def result(self, step: int) -> dict:
        """`results.json`'s 'target': the targets, whether one was reached, and where (else
        the last step)."""
        out = {"valid_loss": self.valid_loss, "bleu": self.bleu, "reached": bool(self.reached)}
        return {**out, **(self.reached or {"step": step})}
