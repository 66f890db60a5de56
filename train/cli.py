"""Helpers shared by the command-line programs (train.main, train.translate, train.sample)."""

from __future__ import annotations

import logging
import sys

# Libraries whose INFO lines (orbax: several per checkpoint) would drown the progress output.
_CHATTY_LIBRARIES = ("/orbax/", "/matplotlib/", "/jax/_src/")

# Exit statuses: a mistake on the command line, config or data (as absl's usage errors), or a
# run that failed after it started (train.errors.RunFailure, an I/O error).
USAGE_ERROR = 2
RUN_ERROR = 1


class _QuietLibraries(logging.Filter):
    """Passes warnings and errors from anywhere, INFO only from outside the chatty libraries."""

    def filter(self, record: logging.LogRecord) -> bool:
        path = record.pathname.replace("\\", "/")
        return record.levelno >= logging.WARNING or not any(p in path for p in _CHATTY_LIBRARIES)


def quiet_library_logs() -> None:
    """Drops INFO records of orbax, matplotlib and jax from every root-logger handler
    (absl's included); call inside `main`, after absl set up logging."""
    for handler in logging.getLogger().handlers:
        handler.addFilter(_QuietLibraries())


def die(message: str, status: int = USAGE_ERROR) -> None:
    """Prints `error: message` to stderr and exits with `status`."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(status)
