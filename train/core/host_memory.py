"""Huge pages for the large buffers XLA allocates on the host, asked of glibc's malloc.

XLA:CPU allocates a step's temporaries afresh at every step; glibc hands a large block
(above its mmap threshold, at most 32 MiB) out as a new mapping, and the kernel then faults
its 4 KiB pages in one at a time, zeroing each. On the default run (configs/default.py)
that is ~74,000 page faults a step, the process's largest system time. Linux's transparent
huge pages map such blocks 2 MiB at a time, but where the kernel's mode is `madvise` (the
default of Debian and Ubuntu) only for memory that asks for them, and glibc asks only when
started with the tunable `glibc.malloc.hugetlb=1` (glibc 2.35+), which it reads once, at
process start. So a `python -m train.<command>` re-executes itself once, before anything
else is imported, with that tunable added to GLIBC_TUNABLES: the same command, the same
process id, its clock (`train.STARTED`) carried over. Measured in benchmarks/RESULTS.md
("Huge pages for XLA's host buffers").

Nothing is done where the kernel maps huge pages for everyone (`always`) or for no one
(`never`), on another C library or operating system, or where GLIBC_TUNABLES already names
`glibc.malloc.hugetlb`: `GLIBC_TUNABLES=glibc.malloc.hugetlb=0` turns it off.
"""

from __future__ import annotations

import os
import pathlib
import platform
import sys
from collections.abc import Callable, MutableMapping

TUNABLE = "glibc.malloc.hugetlb"
THP_MODE = pathlib.Path("/sys/kernel/mm/transparent_hugepage/enabled")
# The first process's start time, read (and removed) by the re-executed one.
STARTED_VAR = "FLAX_TRANSFORMER_STARTED"


def thp_mode(path: os.PathLike | str = THP_MODE) -> str | None:
    """The kernel's transparent-huge-page mode ('always', 'madvise', 'never'), or None where
    the file is absent or unreadable."""
    try:
        text = pathlib.Path(path).read_text()
    except OSError:
        return None
    start, end = text.find("["), text.find("]")
    return text[start + 1 : end] if 0 <= start < end else None


def glibc_supports_hugetlb(libc: tuple[str, str] | None = None) -> bool:
    """Whether this process runs on glibc 2.35 or later (the first with the tunable)."""
    name, version = platform.libc_ver() if libc is None else libc
    if name != "glibc":
        return False
    try:
        major, minor = (int(part) for part in version.split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= (2, 35)


def should_reexec(
    environ: MutableMapping[str, str],
    *,
    mode: str | None,
    glibc_ok: bool,
    jax_imported: bool,
    system: str = sys.platform,
) -> bool:
    """Whether re-executing with the tunable would give this process huge pages it lacks."""
    return (
        system.startswith("linux")
        and glibc_ok
        and mode == "madvise"
        and TUNABLE not in environ.get("GLIBC_TUNABLES", "")
        and not jax_imported  # a process that has started XLA keeps its allocations
    )


def with_tunable(tunables: str) -> str:
    """GLIBC_TUNABLES with `glibc.malloc.hugetlb=1` added to what it already sets."""
    return ":".join(part for part in (tunables, f"{TUNABLE}=1") if part)


def use_huge_pages(
    started: float,
    *,
    environ: MutableMapping[str, str] | None = None,
    execve: Callable[[str, list[str], MutableMapping[str, str]], object] = os.execve,
    mode: str | None = None,
    glibc_ok: bool | None = None,
) -> float:
    """Re-executes the command with huge pages where they are missing; returns its start.

    Called by `train/__init__.py` for `python -m train.<command>` only, before jax or any
    other library is imported. Where the process is the re-executed one, it returns the
    first process's start time (so `wall_s` counts from the command's launch); where there
    is nothing to do, `started`. Where it re-executes, it does not return.

    Args:
      started: `time.time()` when this process began (`train.STARTED`).
      environ: the environment to read and to execute the command with (default
        `os.environ`).
      execve: replaces the process (tests pass a recorder).
      mode: the kernel's THP mode (default: read from /sys).
      glibc_ok: whether glibc has the tunable (default: asked of the C library).
    """
    environ = os.environ if environ is None else environ
    first = environ.pop(STARTED_VAR, None)
    if first is not None:
        try:
            return float(first)
        except ValueError:
            return started
    if not sys.executable:  # an embedded interpreter: no command to execute again
        return started
    if not should_reexec(
        environ,
        mode=thp_mode() if mode is None else mode,
        glibc_ok=glibc_supports_hugetlb() if glibc_ok is None else glibc_ok,
        jax_imported="jax" in sys.modules,
    ):
        return started
    environ["GLIBC_TUNABLES"] = with_tunable(environ.get("GLIBC_TUNABLES", ""))
    environ[STARTED_VAR] = repr(started)
    sys.stdout.flush()
    sys.stderr.flush()
    execve(sys.executable, list(sys.orig_argv), environ)
    return started  # only a test's recorder returns
