"""The training program: `python -m train.<command>` (docs/training.md)."""

import sys
import time

# When the process imported its first train module: for `python -m train.<command>`, the
# command's start, a few milliseconds after the interpreter's, before absl and jax load.
# train.main counts every record's wall_s from it (train.program.metrics.RunClock).
STARTED = time.time()

# While Python locates the module of `python -m train.<command>`, sys.argv[0] is "-m": the
# commands (and only they, never a notebook's `import train`) start jax on the CPU of a host
# without accelerators, before any of them imports jax (train.core.cli.skip_absent_accelerators).
# First, where the kernel gives huge pages only on request, a command re-executes itself once
# so that glibc requests them for XLA's large buffers (train.core.host_memory); STARTED is
# then the first process's start.
if sys.argv[:1] == ["-m"]:
    from train.core.host_memory import use_huge_pages

    STARTED = use_huge_pages(STARTED)

    from train.core.cli import skip_absent_accelerators

    skip_absent_accelerators()
