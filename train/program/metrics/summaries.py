"""Summaries of step sums: per-token means (`summarize`), the training interval's summary
(`TrainLog`) and validation loss (`evaluate_loss`).

Step metrics stay on the device until a summary is due (every `log_every_steps`, and before
every checkpoint), so the host never waits on the accelerator between steps; then they are
fetched together and checked for NaN/inf (`stops.check_finite`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from train.program.metrics.stops import check_finite

# The metrics every step returns as sums (`train.program.steps`, `Task.loss`): over its
# tokens for token cross-entropy; 'tokens' counts the units the objective averages over
# (scored tokens, or a preference task's pairs).
SUM_KEYS = ("loss", "nll", "correct", "tokens")
# What a train step reports besides sums: its gradient norm and learning rate. Every other
# key a task's objective returns is a sum of its own (e.g. TRL's `rewards/chosen`), passed
# through to metrics.jsonl and TensorBoard as its mean per 'tokens' unit.
STEP_KEYS = ("grad_norm", "learning_rate")


def sum_keys(step_metrics: Mapping[str, Any]) -> list[str]:
    """The keys of one step's metrics that are sums: `SUM_KEYS` and the task's own."""
    return [key for key in step_metrics if key not in STEP_KEYS]


# Perplexity overflows float64 above exp(709); report inf beyond this loss.
_MAX_LOG_PERPLEXITY = 700.0

# Steps dispatched before one is waited for, in validation (evaluate_loss) and on several
# CPU devices in the training loop (`train.program.loop`).
STEPS_IN_FLIGHT = 16


def summarize(sums: Mapping[str, float], chars_per_token: float | None = None) -> dict:
    """Per-token means from summed step metrics.

    Args:
        sums: 'loss', 'nll', 'correct', 'tokens' summed over batches (numbers), and any
            sums of the task's own.
        chars_per_token: characters per target token; adds bits per character when given.

    Returns:
        {'loss', 'nll', 'perplexity', 'accuracy', 'tokens'}, each of the task's own sums
        divided by 'tokens' under its own name, and maybe 'bits_per_char'.
    """
    tokens = max(float(sums["tokens"]), 1.0)
    nll = float(sums["nll"]) / tokens
    out = {
        "loss": float(sums["loss"]) / tokens,
        "nll": nll,
        "perplexity": math.exp(nll) if nll < _MAX_LOG_PERPLEXITY else math.inf,
        "accuracy": float(sums["correct"]) / tokens,
        "tokens": int(sums["tokens"]),
    }
    for key, value in sums.items():
        if key not in SUM_KEYS:
            out[key] = float(value) / tokens
    if chars_per_token:
        out["bits_per_char"] = nll / math.log(2) / chars_per_token
    return out


class TrainLog:
    """Collects per-step metric sums, checks them for NaN/inf, and writes summaries."""

    def __init__(self, checkpointer):
        """Args: the run's Checkpointer (named in the divergence message)."""
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
            tokens_per_sec} of the interval, and the task's own sums as means (`summarize`),
            or None if no step is pending.

        Raises:
            TrainingDivergedError: at the first step whose loss or gradient norm is not
                finite, naming it and the last checkpoint kept.
        """
        if not self.pending:
            return None
        fetched = jax.device_get([m for _, m in self.pending])
        check_finite([step for step, _ in self.pending], fetched, self.checkpointer)
        sums = {k: sum(float(m[k]) for m in fetched) for k in sum_keys(fetched[0])}
        summary = summarize(sums)
        summary["grad_norm"] = float(np.mean([float(m["grad_norm"]) for m in fetched]))
        summary["learning_rate"] = float(fetched[-1]["learning_rate"])  # the last step's
        elapsed = time.perf_counter() - self.start
        summary["tokens_per_sec"] = self.tokens / max(elapsed, 1e-9)
        self.pending = []
        self.restart_clock()
        return summary


def evaluate_loss(
    eval_step: Callable, params: Any, batches: Sequence, put_batch: Callable, chars_per_token=None
) -> dict[str, float]:
    """Validation metrics over `batches` (no dropout, no label smoothing).

    Returns:
        `summarize` of the summed metrics: loss, nll, perplexity, accuracy, tokens, the
        task's own sums as means (and bits_per_char when chars_per_token is given).
    """
    sums = dict.fromkeys(SUM_KEYS, 0.0)
    pending = []

    def collect():
        for step_sums in jax.device_get(pending):
            for key in sum_keys(step_sums):
                sums[key] = sums.get(key, 0.0) + float(step_sums[key])
        pending.clear()

    for batch in batches:
        pending.append(eval_step(params, put_batch(batch)))
        # A bounded number of steps in flight: on several CPU devices (train.main's
        # --config.cpu_devices) hundreds of queued steps deadlock XLA's in-process
        # all-reduce (one device's step waits in the collective for a partner never launched).
        if len(pending) == STEPS_IN_FLIGHT:
            collect()
    collect()
    return summarize(sums, chars_per_token)
