"""The two kinds of failure of the training programs, and so their exit statuses.

A usage error (a bad flag, config value or data file) is the caller's to fix before running
again: `ValueError`, `FileNotFoundError`, exit status 2 (`train.cli.USAGE_ERROR`). A run
failure happens to a correct command after it started (a disk full or read-only, a damaged
checkpoint, a work directory locked by another run): `RunFailure`, exit status 1
(`train.cli.RUN_ERROR`); rerunning the same command may succeed once the cause is gone.
"""

from __future__ import annotations


class RunFailure(RuntimeError):
    """A failure of a correct command after it started; its message is one line."""


class CheckpointError(RunFailure, ValueError):
    """A checkpoint cannot be restored. Also a ValueError, as `Checkpointer.restore` always
    documented."""


class DamagedFileError(RunFailure, ValueError):
    """A file a run wrote (config.json, results.json) is empty or not valid JSON."""


class CheckpointWriteError(RunFailure):
    """A checkpoint could not be written (disk full, file size limit, I/O error)."""
