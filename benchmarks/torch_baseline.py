"""Side by side: our training step against torch.nn.Transformer on the same sizes.

    python -m benchmarks.torch_baseline [--sizes ...] [--dropout 0,0.1] [--rounds 5]
        [--steps 5]

Needs torch (`pip install torch==2.13.0` gives the CPU build); exits with a message when it
is missing. Each framework runs in its own worker process (two frameworks' thread pools in
one process slow each other down), built and warmed up once; the parent then asks them in
turn, round after round, to time a few steps, so both see the same machine load while only
one computes at a time. The table reports the median over rounds of each worker's median
step, and the ratio ours / torch in tokens/s (above 1 means we are faster), with the
machine line: only ratios from one run compare.
"""

from __future__ import annotations

import argparse
import json
import sys

import jax
import numpy as np

from benchmarks.common import (
    SIZES,
    Size,
    WorkerProcess,
    machine_line,
    matmul_peak_flops,
    median,
    model_flops_per_step,
    time_steps,
)
from benchmarks.train_throughput import build_step

try:
    import torch
    from torch import nn as tnn
except ImportError:  # pragma: no cover - depends on the machine
    torch = None


def _sinusoidal(length: int, dim: int):
    pos = torch.arange(length, dtype=torch.float32)[:, None]
    freq = torch.pow(10000.0, -torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    table = torch.zeros(length, dim)
    table[:, 0::2] = torch.sin(pos * freq)
    table[:, 1::2] = torch.cos(pos * freq)
    return table


class TorchModel(tnn.Module if torch else object):
    """Embedding + sinusoidal positions + torch.nn.Transformer(Encoder) + tied output."""

    def __init__(self, size: Size, dropout: float):
        super().__init__()
        self.size = size
        self.embed = tnn.Embedding(size.vocab, size.d_model)
        self.register_buffer("pos", _sinusoidal(max(size.src_len, size.tgt_len), size.d_model))
        self.drop = tnn.Dropout(dropout)
        if size.kind == "encdec":
            self.core = tnn.Transformer(
                size.d_model,
                size.heads,
                size.layers,
                size.layers,
                size.d_ff,
                dropout=dropout,
                batch_first=True,
                norm_first=True,
            )
        else:
            layer = tnn.TransformerEncoderLayer(
                size.d_model,
                size.heads,
                size.d_ff,
                dropout=dropout,
                batch_first=True,
                norm_first=True,
            )
            self.core = tnn.TransformerEncoder(
                layer, size.layers, norm=tnn.LayerNorm(size.d_model), enable_nested_tensor=False
            )

    def _emb(self, ids):
        return self.drop(self.embed(ids) * self.size.d_model**0.5 + self.pos[: ids.shape[1]])

    def forward(self, *ids):
        tgt = ids[-1]
        causal = tnn.Transformer.generate_square_subsequent_mask(tgt.shape[1])
        if self.size.kind == "encdec":
            h = self.core(self._emb(ids[0]), self._emb(tgt), tgt_mask=causal, tgt_is_causal=True)
        else:
            h = self.core(self._emb(tgt), mask=causal, is_causal=True)
        return h @ self.embed.weight.T


def torch_step(size: Size, dropout: float):
    model = TorchModel(size, dropout)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    gen = torch.Generator().manual_seed(0)
    src = torch.randint(1, size.vocab, (size.batch, size.src_len), generator=gen)
    tgt = torch.randint(1, size.vocab, (size.batch, size.tgt_len), generator=gen)
    labels = torch.randint(1, size.vocab, (size.batch, size.tgt_len), generator=gen)
    inputs = (src, tgt) if size.kind == "encdec" else (tgt,)
    loss_fn = tnn.CrossEntropyLoss()

    def run():
        opt.zero_grad(set_to_none=True)
        logits = model(*inputs)
        loss = loss_fn(logits.reshape(-1, size.vocab), labels.reshape(-1))
        loss.backward()
        opt.step()

    return run


def jax_step(size: Size, dropout: float):
    step, params, opt_state = build_step(size, dropout=dropout)
    state = {"p": params, "o": opt_state}
    rng = jax.random.key(1)

    def run():
        state["p"], state["o"], loss = step(state["p"], state["o"], rng)
        loss.block_until_ready()

    return run


def torch_matmul_peak(n: int = 1024, steps: int = 10) -> float:
    """Achieved FLOP/s of one large float32 matmul in torch (cf. `matmul_peak_flops`)."""
    a = torch.randn(n, n)
    return 2 * n**3 / median(time_steps(lambda: a @ a, steps))


def worker(framework: str, size_name: str, dropout: float) -> None:
    """One framework's side of the comparison, driven over stdin/stdout by `main`.

    Prints one JSON line when ready (with this framework's matmul peak), then for each
    `time K` line on stdin times K steps and prints their seconds as a JSON list.
    """
    size = SIZES[size_name]
    if framework == "torch":
        torch.set_num_threads(max(1, torch.get_num_threads()))
        run, peak = torch_step(size, dropout), torch_matmul_peak()
    else:
        run, peak = jax_step(size, dropout), matmul_peak_flops()
    time_steps(run, 0, warmup=2)  # compile (jax) and first-touch allocations (both)
    print(json.dumps({"ready": framework, "peak": peak}), flush=True)
    for line in sys.stdin:
        steps = int(line.split()[1])
        print(json.dumps(time_steps(run, steps, warmup=0)), flush=True)


class _Worker(WorkerProcess):
    """A worker process of this module, one framework and size."""

    def __init__(self, framework: str, size: str, dropout: float):
        super().__init__(
            ["benchmarks.torch_baseline", "--worker", framework]
            + ["--sizes", size, "--dropout", str(dropout)]
        )
        self.peak = self.ready["peak"]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="encdec,dec_small,dec_base")
    parser.add_argument("--dropout", default="0,0.1", help="comma-separated rates")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--worker", choices=["ours", "torch"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if torch is None:
        sys.exit("torch is not installed: pip install torch==2.13.0 (the CPU build), then rerun.")
    if args.worker:
        return worker(args.worker, args.sizes, float(args.dropout))
    print(
        f"# machine: {machine_line()}, torch {torch.__version__} "
        f"({torch.get_num_threads()} threads); each framework in its own process, "
        f"{args.rounds} alternating rounds of {args.steps} steps, float32"
    )
    print(
        f"{'size':<10} {'dropout':>7} {'ours tok/s':>11} {'torch tok/s':>12} "
        f"{'ours/torch':>11} {'ours MFU':>9} {'torch MFU':>10}"
    )
    for name in args.sizes.split(","):
        size = SIZES[name]
        for dropout in (float(d) for d in args.dropout.split(",")):
            workers = {k: _Worker(k, name, dropout) for k in ("ours", "torch")}
            medians = {k: [] for k in workers}
            try:
                for _ in range(args.rounds):
                    for key, w in workers.items():
                        medians[key].append(median(w.time(args.steps)))
            finally:
                for w in workers.values():
                    w.close()
            step = {k: float(np.median(v)) for k, v in medians.items()}
            # Each framework's MFU over its own matmul peak, measured in its own process.
            mfu = {k: model_flops_per_step(size) / step[k] / workers[k].peak for k in step}
            print(
                f"{name:<10} {dropout:7.1f} {size.tokens_per_step / step['ours']:11.0f} "
                f"{size.tokens_per_step / step['torch']:12.0f} "
                f"{step['torch'] / step['ours']:11.2f} {mfu['ours']:9.1%} {mfu['torch']:10.1%}",
                flush=True,
            )


if __name__ == "__main__":
    main()
