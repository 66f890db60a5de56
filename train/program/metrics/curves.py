"""The loss-curve PNG: train and validation loss against step, drawn from the run's
`metrics.jsonl` (matplotlib, headless)."""

from __future__ import annotations

import pathlib

import numpy as np

from train.core.rundir import RunDir, atomic_savefig
from train.program.metrics.records import read_metrics


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
