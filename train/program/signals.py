"""Preemption: SIGTERM noticed at a step boundary (`sigterm_notice`, `preempted`), so the
loop saves that step's checkpoint and stops, every process of a run at the same step.
"""

from __future__ import annotations

import contextlib
import signal
import threading

import jax
from jax.experimental import multihost_utils


@contextlib.contextmanager
def sigterm_notice():
    """Yields an Event that SIGTERM sets, the handler installed for the block only.

    Python handles signals in the main thread alone, so elsewhere (a notebook's worker
    thread) nothing is installed. In a run of several processes neither: JAX's preemption
    service (`jax.distributed.initialize`) takes SIGTERM there, and `preempted` asks it.
    """
    notice = threading.Event()
    if threading.current_thread() is not threading.main_thread() or jax.process_count() > 1:
        yield notice
        return
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: notice.set())
    try:
        yield notice
    finally:
        signal.signal(signal.SIGTERM, previous)


def preempted(notice: threading.Event, step: int) -> bool:
    """Whether the loop stops after `step`: SIGTERM came. With several processes, True on
    all of them at the same step (JAX's preemption sync point, the step after the newest
    any process had reached when one got the signal); to be called after every step."""
    if jax.process_count() > 1:
        return multihost_utils.reached_preemption_sync_point(step)
    return notice.is_set()
