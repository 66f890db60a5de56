"""The training program: `python -m train.<command>` (docs/training.md)."""

import sys

# While Python locates the module of `python -m train.<command>`, sys.argv[0] is "-m": the
# commands (and only they, never a notebook's `import train`) start jax on the CPU of a host
# without accelerators, before any of them imports jax (train.cli.skip_absent_accelerators).
if sys.argv[:1] == ["-m"]:
    from train.cli import skip_absent_accelerators

    skip_absent_accelerators()
