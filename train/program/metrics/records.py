"""Where records go: one JSON line per (step, split) in the run's `metrics.jsonl`, the same
scalars as `<split>/<name>` in its TensorBoard folder (`MetricsWriter`), and reading them back
(`read_metrics`). A resumed run drops the records the interrupted run wrote after its last
checkpoint and never writes one twice."""

from __future__ import annotations

import json
import math
import os
import pathlib
from collections.abc import Mapping

from train.core.rundir import RunDir, atomic_write_text
from train.program.metrics.clock import RunClock


class MetricsWriter:
    """Appends records to `metrics.jsonl` and TensorBoard; resumes without duplicates."""

    def __init__(self, run: RunDir, resume_step: int = 0, clock: RunClock | None = None):
        """Opens the writers.

        Args:
            run: the run directory.
            resume_step: the step training restarts from; records of later steps (written
                by the interrupted run after its last checkpoint) are removed from the JSONL;
                those kept are never written twice.
            clock: adds `wall_s` (its seconds when the record is written) to every record;
                None adds nothing.
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
        walls = [r["wall_s"] for r in kept if isinstance(r.get("wall_s"), (int, float))]
        if clock is not None and walls:
            clock.resume_after(max(walls))
        self._tb = SummaryWriter(str(run.tensorboard))
        self.clock = clock

    def write(self, step: int, split: str, values: Mapping[str, float]) -> None:
        """Writes one record; non-finite numbers are stored as strings ('nan', 'inf').

        A record whose (step, split) is already in the file is not written again. With a
        clock, the record gets `wall_s` (unless `values` has one) and its TensorBoard
        events that wall time.
        """
        if (int(step), split) in self._written:
            return
        self._written.add((int(step), split))
        record = {"step": int(step), "split": split}
        walltime = None
        if self.clock is not None:
            values = {**values, "wall_s": values.get("wall_s", self.clock.seconds())}
            walltime = self.clock.epoch(float(values["wall_s"]))
        for name, value in values.items():
            value = float(value)
            record[name] = value if math.isfinite(value) else str(value)
            self._tb.add_scalar(f"{split}/{name}", value, int(step), walltime=walltime)
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
