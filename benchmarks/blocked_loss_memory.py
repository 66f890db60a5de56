"""Memory of the vocabulary head and its loss, plain against in blocks, from XLA.

    python -m benchmarks.blocked_loss_memory [--batch 16] [--length 128] [--vocab 49152]
        [--width 576] [--block-rows 512] [--dtypes float32,bfloat16] [--time]

For hidden states `(B, T, D)` and a head `(D, V)` (default SmolLM2's step: 16 x 128
tokens, N = B x T = 2,048 rows, D = 576, V = 49,152), `jax.value_and_grad` over hidden
states and head of the mean label-smoothed loss is compiled two ways: plain (the full
`(N, V)` logits, then `label_smoothed_cross_entropy`, as the training step did before
issue 58) and blocked (`functional.blocked_cross_entropy`, about `block_rows` rows per
scan step). The compiled program's `memory_analysis()` gives its temporary bytes: the
buffers XLA allocates besides arguments and outputs, where `(N, V)` float32 logits and
their gradient would live. Nothing runs unless `--time` (then the median ms of a few runs:
ratios only, on a quiet machine).
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp

from benchmarks.common import machine_line, median, time_steps
from flax_transformer.functional import blocked_cross_entropy, label_smoothed_cross_entropy
from flax_transformer.functional.precision import mixed_einsum

SMOOTHING = 0.1
PAD_ID = 0


def _plain(hidden_BTD, head_DV, labels_BT, dtype):
    logits_BTV = mixed_einsum("btd,dv->btv", hidden_BTD, head_DV, dtype=dtype)
    loss_BT, weights_BT = label_smoothed_cross_entropy(
        logits_BTV, labels_BT, label_smoothing=SMOOTHING, pad_id=PAD_ID
    )
    return loss_BT.sum() / weights_BT.sum()


def _blocked(block_rows):
    def loss(hidden_BTD, head_DV, labels_BT, dtype):
        weights_BT = (labels_BT != PAD_ID).astype(jnp.float32)
        sums = blocked_cross_entropy(
            hidden_BTD,
            head_DV,
            labels_BT,
            weights_BT,
            block_rows=block_rows,
            label_smoothing=SMOOTHING,
            dtype=dtype,
        )
        return sums["loss"] / sums["tokens"]

    return loss


def compiled(loss, shape: tuple[int, int], width: int, vocab: int, dtype):
    step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)), static_argnums=3)
    hidden = jax.ShapeDtypeStruct((*shape, width), dtype)
    head = jax.ShapeDtypeStruct((width, vocab), jnp.float32)
    labels = jax.ShapeDtypeStruct(shape, jnp.int32)
    return step.lower(hidden, head, labels, dtype).compile()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--width", type=int, default=576)
    parser.add_argument("--block-rows", type=int, default=512)
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--time", action="store_true")
    args = parser.parse_args(argv)
    shape, vocab, width = (args.batch, args.length), args.vocab, args.width
    rows = args.batch * args.length
    logits_bytes = rows * vocab * 4
    print(
        f"# {machine_line()}; B x T = {args.batch} x {args.length} = N={rows} rows, "
        f"D={width}, V={vocab}, label smoothing "
        f"{SMOOTHING}, value and gradient over hidden states and head; one (N, V) float32 "
        f"array = {logits_bytes / 2**20:.0f} MiB"
    )
    for dtype_name in args.dtypes.split(","):
        dtype = jnp.dtype(dtype_name)
        runs = {"plain": _plain, f"blocked({args.block_rows})": _blocked(args.block_rows)}
        for name, loss in runs.items():
            program = compiled(loss, shape, width, vocab, dtype)
            temp = program.memory_analysis().temp_size_in_bytes
            line = (
                f"{dtype_name:8s} {name:13s} temp {temp / 2**20:8.1f} MiB "
                f"({temp / logits_bytes:.2f}x one (N, V) float32 array)"
            )
            if args.time:
                key = jax.random.key(0)
                hidden = jax.random.normal(key, (*shape, width), dtype)
                head = 0.02 * jax.random.normal(key, (width, vocab), jnp.float32)
                labels = jax.random.randint(key, shape, 0, vocab)
                inputs = (hidden, head, labels)
                ms = 1e3 * median(
                    time_steps(lambda p=program, x=inputs: jax.block_until_ready(p(*x)), 3)
                )
                line += f", {ms:.0f} ms"
            print(line, flush=True)


if __name__ == "__main__":
    main()
