"""The progress bar over train steps: live in a terminal, a line every 30 s in a log file,
nothing on processes other than 0."""

from __future__ import annotations

import sys


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
