"""Memory of causal self-attention, forward and backward, by `attention_impl`, from XLA.

    python -m benchmarks.attention_memory [--lengths 1024,2048] [--impls xla,blocked]

For each length T and implementation, `jax.value_and_grad` of a scalar of
`attention_op(q, k, v, AttentionMask(causal=True), impl=...)` over q, k, v (one row, the
GPU recipe's 6 heads of 64) is compiled, and the compiled program's `memory_analysis()`
gives its temporary bytes (the buffers XLA allocates besides arguments and outputs: where
`(N, T, T)` scores and probabilities would live). Nothing runs: these are XLA's figures.
With `--time`, each program also runs a few times (median ms; ratios only, on a quiet
machine).
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp

from benchmarks.common import machine_line, median, time_steps
from flax_transformer.functional import AttentionMask
from flax_transformer.layers.attention_op import attention_op

HEADS, HEAD_DIM = 6, 64


def compiled(impl: str, length: int):
    shape = (1, length, HEADS, HEAD_DIM)
    mask = AttentionMask(causal=True)

    def loss(q, k, v):
        out, _ = attention_op(q, k, v, mask, impl=impl)
        return jnp.sum(out * out)

    spec = jax.ShapeDtypeStruct(shape, jnp.float32)
    step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))
    return step.lower(spec, spec, spec).compile(), shape


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", default="1024,2048")
    parser.add_argument("--impls", default="xla,blocked")
    parser.add_argument("--time", action="store_true")
    args = parser.parse_args(argv)
    print(f"# {machine_line()}; B=1, N={HEADS}, H={HEAD_DIM}, float32, causal, fwd+bwd")
    for length in (int(t) for t in args.lengths.split(",")):
        for impl in args.impls.split(","):
            program, shape = compiled(impl, length)
            temp = program.memory_analysis().temp_size_in_bytes
            scores = HEADS * length * length * 4
            line = (
                f"T={length:5d} {impl:8s} temp {temp / 2**20:8.1f} MiB "
                f"({temp / scores:.2f}x one (N, T, T) float32 array)"
            )
            if args.time:
                x = jax.random.normal(jax.random.key(0), shape)
                ms = 1e3 * median(
                    time_steps(lambda p=program, x=x: jax.block_until_ready(p(x, x, x)), 5)
                )
                line += f", {ms:.1f} ms"
            print(line, flush=True)


if __name__ == "__main__":
    main()
