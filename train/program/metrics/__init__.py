"""Metrics and logging, one job a module: the run clock (`clock`), where records go
(`records`: `metrics.jsonl` and TensorBoard), the loss-curve PNG (`curves`), the progress bar
(`progress`), summaries of step sums and validation loss (`summaries`), divergence and target
stops (`stops`), and the report printed at the end of a run (`report`).

Every record is one JSON line `{"step": s, "split": "train" | "valid" | "bleu", ...,
"wall_s": t}` in the run directory's metrics file; the same scalars go to its TensorBoard
folder as `<split>/<name>` (`train.core.rundir` names both). `wall_s` (`RunClock`) is the
seconds since the command started, start-up and compilation included, so time to quality
reads off any run; TensorBoard gets it as `<split>/wall_s` and as each event's wall time
(its "relative" axis is then the same clock, across resumes too).

The names below are re-exported so that `from train.program.metrics import X` and
`metrics.X` read the same as before the split.
"""

from train.program.metrics.clock import RunClock
from train.program.metrics.curves import plot_loss_curve
from train.program.metrics.progress import progress_bar
from train.program.metrics.records import MetricsWriter, read_metrics
from train.program.metrics.report import format_report, format_samples, format_target
from train.program.metrics.stops import Target, TrainingDivergedError, check_finite
from train.program.metrics.summaries import (
    STEPS_IN_FLIGHT,
    SUM_KEYS,
    TrainLog,
    evaluate_loss,
    summarize,
)

__all__ = [
    "STEPS_IN_FLIGHT",
    "SUM_KEYS",
    "MetricsWriter",
    "RunClock",
    "Target",
    "TrainLog",
    "TrainingDivergedError",
    "check_finite",
    "evaluate_loss",
    "format_report",
    "format_samples",
    "format_target",
    "plot_loss_curve",
    "progress_bar",
    "read_metrics",
    "summarize",
]
