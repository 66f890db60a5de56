"""How long the training loop stops per checkpoint: synchronous vs asynchronous orbax saves.

    python -m benchmarks.checkpoint_stall [--params 100e6] [--repeats 3] [--dir /tmp]

A float32 state of about `--params` parameters (jnp arrays on the default device, in
2048 x 4096 matrices) is saved with `train.program.checkpoint.Checkpointer` a few times in each
mode, into a fresh temporary directory under `--dir`. The stall is the time `save()` takes,
which is what the loop waits for: the whole write when synchronous; when asynchronous, the
copy to host memory and orbax's bookkeeping (the write then goes on in a background thread).
Each asynchronous save is timed after the previous write finished, as in a run whose
checkpoint period is longer than a write; the write's full time is shown beside it.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import jax
import jax.numpy as jnp

from train.program.checkpoint import Checkpointer

# The shape of each array of the benchmark state (8.4M float32 values, 32 MiB).
_MATRIX = (2048, 4096)


def make_state(num_params: float) -> dict:
    """A dict of float32 matrices holding at least `num_params` values, on the device."""
    per = _MATRIX[0] * _MATRIX[1]
    count = max(1, -(-int(num_params) // per))
    keys = jax.random.split(jax.random.key(0), count)
    state = {f"w{i:02d}": jax.random.normal(k, _MATRIX, jnp.float32) for i, k in enumerate(keys)}
    return jax.block_until_ready(state)


def measure(state: dict, asynchronous: bool, repeats: int, directory: str) -> tuple[list, list]:
    """(stalls, write times) in seconds of `repeats` saves of `state`."""
    stalls, writes = [], []
    with tempfile.TemporaryDirectory(dir=directory) as workdir:
        checkpointer = Checkpointer(workdir, keep=2, asynchronous=asynchronous)
        for step in range(1, repeats + 1):
            start = time.perf_counter()
            checkpointer.save(step, state, {"step": step})
            stalls.append(time.perf_counter() - start)
            checkpointer.wait()
            writes.append(time.perf_counter() - start)
        checkpointer.close()
    return stalls, writes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=float, default=100e6, help="state size (values)")
    parser.add_argument("--repeats", type=int, default=3, help="saves per mode")
    parser.add_argument("--dir", default=None, help="where the temporary directories go")
    args = parser.parse_args()
    state = make_state(args.params)
    num = sum(x.size for x in jax.tree.leaves(state))
    size_mb = sum(x.nbytes for x in jax.tree.leaves(state)) / 1e6
    print(f"state: {num / 1e6:.1f}M float32 values ({size_mb:.0f} MB) on {jax.devices()[0]}")
    measure(state, True, 1, args.dir)  # warm-up: orbax's and TensorStore's first-use costs
    rows = {}
    for name, asynchronous in (("synchronous", False), ("asynchronous", True)):
        rows[name] = measure(state, asynchronous, args.repeats, args.dir)
    print(
        "\n| saves | stall per checkpoint (median, s) | each (s) | write done after (median, s) |"
    )
    print("|---|---|---|---|")
    for name, (stalls, writes) in rows.items():
        each = ", ".join(f"{s:.2f}" for s in stalls)
        print(
            f"| {name} | {statistics.median(stalls):.2f} | {each} | "
            f"{statistics.median(writes):.2f} |"
        )
    ratio = statistics.median(rows["synchronous"][0]) / statistics.median(rows["asynchronous"][0])
    print(f"\nsynchronous / asynchronous stall: {ratio:.1f}x")


if __name__ == "__main__":
    main()
