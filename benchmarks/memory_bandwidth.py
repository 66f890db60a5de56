"""Memory read bandwidth of this machine, and the fraction of it batch-1 decoding uses.

    python -m benchmarks.memory_bandwidth [--tokens-per-s 1200]

At batch 1 a decoding step multiplies one token's activations by every weight matrix, so
it must read every parameter once per token (the tied embedding too: it is the output
projection) plus the keys/values of the cache; arithmetic is 2 FLOPs per weight, far below
what the cores can do. Its speed limit is then bytes per token / read bandwidth. This module
measures both terms:

- read bandwidth: a jitted `jnp.sum`, numpy's `sum`, and a jitted matrix-vector product
  (the kernel a batch-1 step runs) over a float32 array, median of a few runs, the fastest
  of the three; at 1 GiB (main memory) and at 16 MiB (it fits the last-level cache, as do
  this model's 21 MB of float32 weights on a CPU with a 32 MiB L3 that nothing else uses).
- bytes per token: the parameter bytes of the model (from `jax.eval_shape` of its init,
  nothing allocated) plus the cache bytes each step reads. Our cached step attends over all
  L = prompt + new slots, masked (static shapes), so it reads the whole cache every step.

`report(config, P, N, tokens_per_s)` puts them together; `benchmarks.generation
--bandwidth` calls it with the measured batch-1 speed.
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from flax_transformer import DecoderOnlyTransformer, TransformerConfig
from flax_transformer.decoding import init_cache

GIB = 1 << 30
MIB = 1 << 20


def _median_seconds(run, runs: int) -> float:
    run()  # compile, first touch
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


# Columns of the matrix the matrix-vector probe reads (a row is one 4 KiB page).
GEMV_COLUMNS = 1024


def read_bandwidth(nbytes: int, runs: int = 5) -> dict[str, float]:
    """Bytes/s of reading a float32 array of `nbytes`, by three readers and the best.

    Returns `{'sum': jitted jnp.sum, 'numpy': numpy sum, 'gemv': jitted (R, 1024) @
    (1024,), 'best': the largest}`.
    """
    host = np.random.default_rng(0).random(nbytes // 4, dtype=np.float32)
    device = jnp.asarray(host)
    matrix = device.reshape(-1, GEMV_COLUMNS)
    vector = jnp.ones((GEMV_COLUMNS,), jnp.float32)
    total, gemv = jax.jit(jnp.sum), jax.jit(jnp.matmul)
    rates = {
        "sum": nbytes / _median_seconds(lambda: total(device).block_until_ready(), runs),
        "numpy": nbytes / _median_seconds(host.sum, runs),
        "gemv": nbytes / _median_seconds(lambda: gemv(matrix, vector).block_until_ready(), runs),
    }
    rates["best"] = max(rates.values())
    return rates


def _nbytes(tree) -> int:
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))


def bytes_per_token(config: TransformerConfig, prompt_len: int, new_tokens: int) -> dict:
    """`{'params': ..., 'cache': ...}`: bytes a batch-1 decoding step reads."""
    model = DecoderOnlyTransformer(config)
    tokens = jnp.ones((1, prompt_len), jnp.int32)
    shapes = jax.eval_shape(model.init, jax.random.key(0), tokens)
    cache = jax.eval_shape(lambda: init_cache(config, 1, prompt_len + new_tokens))
    return {"params": _nbytes(shapes["params"]), "cache": _nbytes(cache["decoder"])}


def report(
    config: TransformerConfig, prompt_len: int, new_tokens: int, tokens_per_s: float | None
) -> str:
    """Lines: bytes per token, bandwidth at 1 GiB and 16 MiB, and the fraction reached."""
    need = bytes_per_token(config, prompt_len, new_tokens)
    per_token = need["params"] + need["cache"]
    lines = [
        f"# batch-1 bytes per token: {need['params'] / MIB:.1f} MiB of parameters + "
        f"{need['cache'] / MIB:.2f} MiB of KV cache = {per_token / MIB:.1f} MiB"
    ]
    for label, size in (("1 GiB (main memory)", GIB), ("16 MiB (last-level cache)", 16 * MIB)):
        rate = read_bandwidth(size)
        line = (
            f"# read bandwidth, {label}: {rate['best'] / 1e9:.1f} GB/s "
            f"(sum {rate['sum'] / 1e9:.1f}, numpy {rate['numpy'] / 1e9:.1f}, "
            f"matrix-vector {rate['gemv'] / 1e9:.1f})"
        )
        if tokens_per_s:
            used = tokens_per_s * per_token
            line += f"; decoding at {tokens_per_s:,.0f} tok/s reads {used / 1e9:.1f} GB/s = "
            line += f"{used / rate['best']:.0%} of it"
        lines.append(line)
    return "\n".join(lines)


def main(argv=None) -> None:
    from benchmarks.common import (
        DECODE_CONFIG,
        DECODE_NEW_TOKENS,
        DECODE_PROMPT_LEN,
        machine_line,
    )

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens-per-s", type=float, default=None, help="batch-1 decoding speed")
    args = parser.parse_args(argv)
    print(f"# machine: {machine_line()}")
    print(report(DECODE_CONFIG, DECODE_PROMPT_LEN, DECODE_NEW_TOKENS, args.tokens_per_s))


if __name__ == "__main__":
    main()
