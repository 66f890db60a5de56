"""The run clock (`RunClock`): the seconds since the command started, start-up and compilation
included, carried across resumes, so every record's `wall_s` reads as time to quality."""

from __future__ import annotations

import time


class RunClock:
    """The seconds a run has taken: since its command started, start-up and compilation
    included; a resumed run counts on from the seconds its last checkpoint recorded.

    So a resumed run's clock adds the restart (start-up, compilation, restore) and leaves
    out the steps lost after that checkpoint, which are trained again and counted then:
    the clock is the time the run's records cost, as if it had never stopped, plus its
    restarts. Where the stopped run kept a record written after its checkpoint (the report
    of a run that ended at that step), the restart counts on from that record's clock.
    Monotonic (`time.perf_counter`) within a process.
    """

    def __init__(self, started: float | None = None):
        """Args: started: `time.time()` when the command started (e.g. `train.main` reads
        it before importing anything heavy); None: now."""
        now_epoch, now = time.time(), time.perf_counter()
        started = now_epoch if started is None else started
        self._origin = now - (now_epoch - started)  # the start on the perf_counter clock
        self._started_epoch = started
        self.offset = 0.0

    def resume(self, seconds: float) -> None:
        """Counts on from `seconds`, the clock a checkpoint recorded."""
        self.offset = float(seconds)

    def resume_after(self, seconds: float) -> None:
        """Counts on from `seconds` where that is later than the checkpoint's clock: a record
        the interrupted run kept was written after its checkpoint (the report of a run that
        stopped at that step), so the restart comes after it and no record goes back in time."""
        self.offset = max(self.offset, float(seconds))

    def seconds(self) -> float:
        """The run's seconds so far."""
        return self.offset + time.perf_counter() - self._origin

    def epoch(self, seconds: float) -> float:
        """The `time.time()` at which a run that never stopped would have reached `seconds`
        (TensorBoard's event wall time)."""
        return self._started_epoch - self.offset + seconds
