"""Timing and worker processes of the benchmark scripts, in plain Python: a worker that runs
torch (benchmarks.nanogpt_peer, benchmarks.speedrun) imports this without starting jax,
whose import would count in its time. `benchmarks.common` names these too."""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable


def time_steps(run: Callable[[], object], steps: int, warmup: int = 2) -> list[float]:
    """Seconds per call of `run` (which must block until its result is ready)."""
    for _ in range(warmup):
        run()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return times


def median(values: list[float]) -> float:
    return statistics.median(values)


class WorkerProcess:
    """A benchmark worker in a process of its own (each framework apart): started with
    `args` after `python -m`, it prints one JSON line when ready (kept as `ready`), then
    answers each `time STEPS` line on its stdin with a JSON list of step times. A one-shot
    worker (benchmarks.speedrun's runs) prints its result as that line and exits."""

    def __init__(self, args: list[str]):
        import subprocess
        import sys

        self.process = subprocess.Popen(
            [sys.executable, "-m", *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self.ready = json.loads(self._read())

    def _read(self) -> str:
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"benchmark worker exited with {self.process.wait()}")
        return line

    def time(self, steps: int) -> list[float]:
        self.process.stdin.write(f"time {steps}\n")
        self.process.stdin.flush()
        return json.loads(self._read())

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait()
