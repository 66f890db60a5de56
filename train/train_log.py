"""What the user sees during training: the progress bar, interval summaries, divergence checks.

Step metrics stay on the device until a summary is due (every `log_every_steps`, and before
every checkpoint), so the host never waits on the accelerator between steps; then they are
fetched together and checked for NaN/inf, so a diverged run stops with the step named, before
a bad state can be checkpointed.
"""

from __future__ import annotations

import math
import sys
import time

import jax
import numpy as np

from train.errors import RunFailure
from train.metrics import summarize

_SUM_KEYS = ("loss", "nll", "correct", "tokens")


class TrainingDivergedError(RunFailure):
    """The loss (or the parameters) became NaN or infinite."""


def progress_bar(total: int, initial: int, enabled: bool = True):
    """A tqdm bar over train steps; in a log file (not a terminal) it updates every 30 s.

    `enabled=False` (processes other than 0 of a multi-process run) shows nothing.
    """
    from tqdm import tqdm

    interactive = sys.stderr.isatty()
    return tqdm(
        total=total,
        initial=initial,
        unit="step",
        dynamic_ncols=True,
        mininterval=0.5 if interactive else 30.0,  # a log file gets a line every 30 s
        desc="train",
        disable=not enabled,
    )


class TrainLog:
    """Collects per-step metric sums, checks them for NaN/inf, and writes summaries."""

    def __init__(self, schedule, accum_steps: int, checkpointer):
        """Args: the learning-rate schedule (for the logged rate), grad_accum_steps, and the
        run's Checkpointer (named in the divergence message)."""
        self.schedule, self.accum_steps = jax.jit(schedule), accum_steps
        self.checkpointer = checkpointer
        self.pending: list[tuple[int, dict]] = []
        self.restart_clock()

    def restart_clock(self) -> None:
        """Starts a new tokens/s interval (after evaluation or saving, which are not training)."""
        self.tokens, self.start = 0, time.perf_counter()

    def add(self, step: int, metrics: dict, tokens: int) -> None:
        self.pending.append((step, metrics))
        self.tokens += tokens

    def check(self) -> dict[str, float] | None:
        """Fetches the pending step metrics and summarises them.

        Returns:
            {loss, nll, perplexity, accuracy, tokens, grad_norm, learning_rate,
            tokens_per_sec} of the interval, or None if no step is pending.

        Raises:
            TrainingDivergedError: at the first step whose loss or gradient norm is not
                finite, naming it and the last checkpoint kept.
        """
        if not self.pending:
            return None
        fetched = jax.device_get([m for _, m in self.pending])
        for (step, _), metrics in zip(self.pending, fetched, strict=True):
            if not (
                math.isfinite(float(metrics["loss"])) and math.isfinite(float(metrics["grad_norm"]))
            ):
                last = self.checkpointer.latest_step()
                kept = f"step {last}" if last is not None else "none saved yet"
                raise TrainingDivergedError(
                    f"Training diverged at step {step}: loss={float(metrics['loss'])}, "
                    f"grad_norm={float(metrics['grad_norm'])}. The last good checkpoint "
                    f"({kept}) is kept in {self.checkpointer.directory}. Lower "
                    "--config.learning_rate, raise --config.warmup_steps or set "
                    "--config.grad_clip_norm, then rerun (it resumes from that checkpoint)."
                )
        sums = {k: sum(float(m[k]) for m in fetched) for k in _SUM_KEYS}
        summary = summarize(sums)
        summary["grad_norm"] = float(np.mean([float(m["grad_norm"]) for m in fetched]))
        last_step = self.pending[-1][0]
        summary["learning_rate"] = float(self.schedule((last_step - 1) // self.accum_steps))
        elapsed = time.perf_counter() - self.start
        summary["tokens_per_sec"] = self.tokens / max(elapsed, 1e-9)
        self.pending = []
        self.restart_clock()
        return summary
