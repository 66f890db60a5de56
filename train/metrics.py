"""Metric summaries, and where they go: `metrics.jsonl`, TensorBoard events, a loss-curve PNG.

Every record is one JSON line `{"step": s, "split": "train" | "valid" | "bleu", ...}` in the
run directory's metrics file; the same scalars go to its TensorBoard folder as
`<split>/<name>` (`train.rundir` names both).
"""

from __future__ import annotations

import json
import math
import os
import pathlib
from collections.abc import Mapping

import numpy as np

from train.rundir import RunDir, atomic_savefig, atomic_write_text

# Perplexity overflows float64 above exp(709); report inf beyond this loss.
_MAX_LOG_PERPLEXITY = 700.0


def summarize(sums: Mapping[str, float], chars_per_token: float | None = None) -> dict:
    """Per-token means from summed step metrics.

    Args:
        sums: 'loss', 'nll', 'correct', 'tokens' summed over batches (numbers).
        chars_per_token: characters per target token; adds bits per character when given.

    Returns:
        {'loss', 'nll', 'perplexity', 'accuracy', 'tokens'} and maybe 'bits_per_char'.
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
    if chars_per_token:
        out["bits_per_char"] = nll / math.log(2) / chars_per_token
    return out


class MetricsWriter:
    """Appends records to `metrics.jsonl` and TensorBoard; resumes without duplicates."""

    def __init__(self, run: RunDir, resume_step: int = 0):
        """Opens the writers.

        Args:
            run: the run directory.
            resume_step: the step training restarts from; records of later steps (written
                by the interrupted run after its last checkpoint) are removed from the JSONL;
                those kept are never written twice.
        """
        from tensorboardX import SummaryWriter  # heavy import, only where written

        self.path = run.metrics
        kept = []
        if self.path.exists():
            kept = [r for r in read_metrics(self.path) if r["step"] <= resume_step]
            atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in kept))
        # (step, split) of every record in the file: a resumed run that evaluates a step again
        # (e.g. the final one, when results.json was lost) must not log it twice.
        self._written = {(r["step"], r["split"]) for r in kept}
        self._tb = SummaryWriter(str(run.tensorboard))

    def write(self, step: int, split: str, values: Mapping[str, float]) -> None:
        """Writes one record; non-finite numbers are stored as strings ('nan', 'inf').

        A record whose (step, split) is already in the file is not written again.
        """
        if (int(step), split) in self._written:
            return
        self._written.add((int(step), split))
        record = {"step": int(step), "split": split}
        for name, value in values.items():
            value = float(value)
            record[name] = value if math.isfinite(value) else str(value)
            self._tb.add_scalar(f"{split}/{name}", value, int(step))
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")

    def close(self) -> None:
        self._tb.close()


def read_metrics(path: str | os.PathLike) -> list[dict]:
    """All records of a `metrics.jsonl` (a truncated last line is skipped)."""
    records = []
    for line in pathlib.Path(path).read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut short by a kill
    return records


def plot_loss_curve(run: RunDir) -> pathlib.Path | None:
    """Plots train and validation loss against step from the run's metrics into its
    loss-curve PNG.

    Returns:
        The PNG path, or None when there is nothing to plot.
    """
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    from matplotlib import pyplot as plt

    path = run.metrics
    if not path.exists():
        return None
    records = read_metrics(path)
    fig, ax = plt.subplots(figsize=(7, 4))
    plotted = False
    for split, key, label in (
        ("train", "nll", "train"),  # without label smoothing, like the validation loss
        ("valid", "nll", "validation"),
    ):
        points = [(r["step"], r[key]) for r in records if r["split"] == split and key in r]
        points = [(s, v) for s, v in points if isinstance(v, float)]
        if points:
            steps, values = np.asarray(points).T
            ax.plot(steps, values, marker="o" if split == "valid" else None, label=label)
            plotted = True
    if not plotted:
        plt.close(fig)
        return None
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats per target token)")
    ax.grid(alpha=0.3)
    ax.legend()
    out = run.loss_curve
    fig.tight_layout()
    atomic_savefig(fig, out, dpi=100)
    plt.close(fig)
    return out
