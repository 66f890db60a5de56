"""The two kinds of failure a program reports and their exit statuses.

A usage error (a bad flag, config value or data file) is the caller's to fix before running
again: `ValueError`, `FileNotFoundError`, exit status 2 (`USAGE_ERROR`). A run failure
happens to a correct command after it started (a disk full or read-only, a damaged
checkpoint, a work directory locked by another run): `RunFailure`, exit status 1
(`RUN_ERROR`); rerunning the same command may succeed once the cause is gone. A run
stopped by SIGTERM (a preemption notice) saves a checkpoint at the next step boundary and
exits with 143 (`PREEMPTED`, 128 + SIGTERM, what a shell reports for a process that
SIGTERM ended): nothing to fix, rerun the same command to resume.

The library modules (run directory, checkpointer, config checks, metrics, store writer)
raise these; train/core/cli.py turns them into one-line errors and exit statuses.
"""

from __future__ import annotations

import re
from typing import Any

# Exit statuses: a mistake on the command line, config or data (as absl's usage errors), or a
# run that failed after it started (RunFailure, an I/O error).
USAGE_ERROR = 2
RUN_ERROR = 1
# A run stopped by SIGTERM after saving a checkpoint: 128 + SIGTERM's number (15), the
# status of a process that SIGTERM ends, so a scheduler reads it as 'terminated on request'.
PREEMPTED = 143


class RunFailure(RuntimeError):
    """A failure of a correct command after it started; its message is one line."""


class CheckpointError(RunFailure, ValueError):
    """A checkpoint cannot be restored. Also a ValueError, as `Checkpointer.restore` always
    documented."""


class DamagedFileError(RunFailure, ValueError):
    """A file a run wrote (config.json, results.json) is empty or not valid JSON."""


class CheckpointWriteError(RunFailure):
    """A checkpoint could not be written (disk full, file size limit, I/O error)."""


class Preempted(Exception):
    """A run stopped by SIGTERM at a step boundary after saving that step's checkpoint; its
    message is the one line to print. Not a RunFailure: nothing failed."""


def fail(field: str, value: Any, expected: str) -> ValueError:
    """The error for a bad config value: `--config.<field>=<value>: <expected>.` (a field of
    a sub-section is dotted: `optimizer.muon.learning_rate`)."""
    return ValueError(f"--config.{field}={value!r}: {expected}.")


# How TransformerConfig names the field it refuses: "TransformerConfig.num_heads=5 ...".
_MODEL_FIELD = re.compile(r"^TransformerConfig\.(\w+)")


def model_field_error(err: Exception, data_fields: tuple[str, ...] = ()) -> ValueError:
    """A `TransformerConfig` refusal as the flag that sets the field: `--config.model.<field>`,
    or `--config.<field>` for the `data_fields` the program fills from the data section
    (vocab_size, max_len). A message that names no field gets the general hint."""
    message = str(err)
    found = _MODEL_FIELD.match(message)
    if not found:
        return ValueError(f"{message} (set it with --config.model.<field>=...)")
    field = found.group(1)
    flag = f"--config.{field}" if field in data_fields else f"--config.model.{field}"
    return ValueError(flag + message[found.end() :])
