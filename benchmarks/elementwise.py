"""The step's elementwise pieces that issue 42 changed, old form against new, in one process.

    python -m benchmarks.elementwise

- GELU: `jax.nn.gelu(x, approximate=False)` (XLA lowers its `erfc` to a range-split
  polynomial) against `functional.gelu` (the `erf` form), forward and value-and-gradient.
- Dropout: `jax.random.bernoulli` + `where` (one float32 uniform per element) against
  `functional.dropout` (two 16-bit draws per 32-bit word), on the shapes of nanoGPT's CPU
  and GPU recipes' residual (B, T, D) and attention-weight (B, N, T, T) arrays.

Each pair is timed alternately (3 rounds, median of 50 jitted calls each), so both see the
same machine; the ratio is old / new (above 1: the new form is faster).
"""

from __future__ import annotations

import argparse
import json

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.common import machine_line, median, time_steps
from flax_transformer.functional import dropout, gelu

RATE = 0.2


def _bernoulli_dropout(x, key):
    keep = jax.random.bernoulli(key, 1.0 - RATE, x.shape)
    return jnp.where(keep, x / (1.0 - RATE), 0.0)


def _pairs():
    x = jnp.asarray(np.random.default_rng(0).normal(size=(12, 64, 512)), jnp.float32)
    exact = jax.jit(lambda x: jax.nn.gelu(x, approximate=False))
    ours = jax.jit(gelu)
    exact_vg = jax.jit(jax.value_and_grad(lambda x: jax.nn.gelu(x, approximate=False).sum()))
    ours_vg = jax.jit(jax.value_and_grad(lambda x: gelu(x).sum()))
    yield "gelu fwd (12, 64, 512)", (lambda: exact(x)), (lambda: ours(x))
    yield "gelu value+grad (12, 64, 512)", (lambda: exact_vg(x)), (lambda: ours_vg(x))
    key = jax.random.key(0)
    old = jax.jit(_bernoulli_dropout)
    new = jax.jit(lambda x, key: dropout(x, RATE, key))
    for shape in [(12, 64, 128), (12, 4, 64, 64), (64, 256, 384), (8, 6, 256, 256)]:
        y = jnp.ones(shape, jnp.float32)
        yield f"dropout {shape}", (lambda y=y: old(y, key)), (lambda y=y: new(y, key))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=50)
    args = parser.parse_args(argv)
    print(f"# {machine_line()}")
    for name, old, new in _pairs():
        times = {"old": [], "new": []}
        for _ in range(args.rounds):
            for label, fn in (("old", old), ("new", new)):
                call = lambda fn=fn: jax.block_until_ready(fn())  # noqa: E731
                times[label].append(median(time_steps(call, args.calls, warmup=3)))
        row = {k: round(1e6 * median(v), 1) for k, v in times.items()}
        ratio = median(times["old"]) / median(times["new"])
        print(json.dumps({"what": name, "us": row, "old_over_new": round(ratio, 2)}))


if __name__ == "__main__":
    main()
