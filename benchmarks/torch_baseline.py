"""Side by side: our training step against torch.nn.Transformer on the same sizes.

    python benchmarks/torch_baseline.py [--sizes ...] [--rounds 3] [--steps 5]

Needs torch (`pip install torch==2.13.0` gives the CPU build); exits with a message when it
is missing. Each round times every size in both frameworks, alternating, so that both see
the same machine load; the table reports the median over rounds of each framework's median
step, and the ratio ours / torch in tokens/s (above 1 means we are faster).
"""

from __future__ import annotations

import argparse
import sys

import jax

from benchmarks.common import SIZES, Size, machine_line, median, time_steps
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

    def __init__(self, size: Size):
        super().__init__()
        self.size = size
        self.embed = tnn.Embedding(size.vocab, size.d_model)
        self.register_buffer("pos", _sinusoidal(max(size.src_len, size.tgt_len), size.d_model))
        self.drop = tnn.Dropout(0.1)
        if size.kind == "encdec":
            self.core = tnn.Transformer(
                size.d_model,
                size.heads,
                size.layers,
                size.layers,
                size.d_ff,
                dropout=0.1,
                batch_first=True,
                norm_first=True,
            )
        else:
            layer = tnn.TransformerEncoderLayer(
                size.d_model, size.heads, size.d_ff, dropout=0.1, batch_first=True, norm_first=True
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


def torch_step(size: Size):
    model = TorchModel(size)
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


def jax_step(size: Size):
    step, params, opt_state = build_step(size)
    state = {"p": params, "o": opt_state}
    rng = jax.random.key(1)

    def run():
        state["p"], state["o"], loss = step(state["p"], state["o"], rng)
        loss.block_until_ready()

    return run


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="encdec,dec_small,dec_base")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args(argv)
    if torch is None:
        sys.exit("torch is not installed: pip install torch==2.13.0 (the CPU build), then rerun.")
    torch.set_num_threads(max(1, torch.get_num_threads()))
    print(
        f"# machine: {machine_line()}, torch {torch.__version__} "
        f"({torch.get_num_threads()} threads)"
    )
    print(f"{'size':<10} {'ours tok/s':>11} {'torch tok/s':>12} {'ours/torch':>11}")
    for name in args.sizes.split(","):
        size = SIZES[name]
        runs = {"ours": jax_step(size), "torch": torch_step(size)}
        medians = {k: [] for k in runs}
        for _ in range(args.rounds):
            for key, run in runs.items():
                medians[key].append(median(time_steps(run, args.steps, warmup=1)))
        ours = size.tokens_per_step / median(medians["ours"])
        theirs = size.tokens_per_step / median(medians["torch"])
        print(f"{name:<10} {ours:11.0f} {theirs:12.0f} {ours / theirs:11.2f}", flush=True)


if __name__ == "__main__":
    main()
