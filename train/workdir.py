"""The work directory of a run: created and checked before any compute is spent."""

from __future__ import annotations

import os
import pathlib
import tempfile

from train.errors import RunFailure


def prepare_workdir(workdir: str | os.PathLike) -> pathlib.Path:
    """Creates `workdir` if missing and checks that files can be written in it.

    Args:
        workdir: the run directory (`--workdir`).

    Returns:
        The directory as a Path.

    Raises:
        ValueError: `workdir` (or a parent) is a regular file: a usage error.
        RunFailure: the directory cannot be created or written (read-only, no permission,
            disk full).
    """
    path = pathlib.Path(workdir)
    blocker = next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        raise ValueError(
            f"--workdir {path}: {blocker} is a regular file, not a directory ; pass a "
            "directory (created if missing), or move the file away."
        )
    try:
        path.mkdir(parents=True, exist_ok=True)
        # Writing is the only reliable test: os.access ignores read-only mounts and root.
        fd, probe = tempfile.mkstemp(prefix=".write_test.", dir=path)
        os.close(fd)
        os.remove(probe)
    except OSError as err:
        raise RunFailure(
            f"--workdir {path}: cannot write there ({err.strerror or err}) ; choose a "
            "writable --workdir, or fix its permissions or mount."
        ) from err
    return path
