"""Our training step against a nanoGPT-style PyTorch GPT, eager and torch.compile, on
nanoGPT's shakespeare_char recipes.

    python -m benchmarks.nanogpt_peer --recipe cpu --dropout 0,0.2 --rounds 3
    python -m benchmarks.nanogpt_peer --recipe gpu_b8 --variants ours,eager,compile
    python -m benchmarks.nanogpt_peer --recipe gpu_b8 --dropout 0.2 \
        --variants ours,ours:rbg,ours:unsafe_rbg

The peer (`PeerGPT`, written here) has nanoGPT's design: fused QKV projection,
`F.scaled_dot_product_attention(is_causal=True)`, GELU MLP 4x wide, pre-LN, learned
positions, tied embeddings, no biases (LayerNorm without shift too), dropout on the
embeddings, attention weights and both residual branches, normal(0.02) init with the output
projections scaled by 1/sqrt(2 * layers), AdamW (lr 1e-3, b2 0.99, weight decay 0.1 on the
matrices, fused where torch has it) and global-norm clipping at 1.

Ours is what `train.main` runs: configs/lm_kjv.py overridden to the same recipe, turned into
sections by `config_lib.validate_config`, the model, optimizer and jitted step built by
`train_lib.build_program`, the state by `steps.create_train_state`; the timed call is
`train_step(state, put_batch(batch))` on a fixed random batch of a 65-symbol vocabulary
(shakespeare_char's), blocked on its metrics. Compilation is excluded (warm-up steps).

Each variant runs in its own worker process, built and warmed up once; the parent asks them
in turn, round after round (the order rotates each round), to time a few steps, so all see
the same machine load while only one computes. Per round, the ratio peer step / our step
(above 1: we are faster); the table gives the median of those ratios over rounds, with the
load average before and after. Only ratios from one run compare.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import subprocess
import sys

# No jax at import: the torch workers (and benchmarks.speedrun's peer) import this module.
from benchmarks.processes import WorkerProcess, median, time_steps

VOCAB = 65  # shakespeare_char's vocabulary


@dataclasses.dataclass(frozen=True)
class Recipe:
    """One nanoGPT recipe (config/train_shakespeare_char.py and its CPU variant)."""

    layers: int
    width: int
    heads: int
    block: int  # tokens per row
    batch: int  # rows per step

    @property
    def flops_per_step(self) -> float:
        """6 per parameter-token (tied output matmul included) + 12 * L * D * T per token."""
        d, t = self.width, self.block
        per_token = 6 * (self.layers * 12 * d * d + d * VOCAB) + 12 * self.layers * d * t
        return float(per_token * self.batch * t)


RECIPES = {
    # README's "I only have a macbook" command: 4 layers, 128 wide, 64 tokens x 12 rows.
    "cpu": Recipe(4, 128, 4, 64, 12),
    # config/train_shakespeare_char.py: 6 layers, 384 wide, 256 tokens x 64 rows.
    "gpu": Recipe(6, 384, 6, 256, 64),
    # The same model on 8 rows: 1/8 of the step, so three rounds fit on a 2-core CPU.
    "gpu_b8": Recipe(6, 384, 6, 256, 8),
}


# --------------------------------------------------------------------------- the torch peer


def _peer_classes():
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Block(nn.Module):
        def __init__(self, r: Recipe, dropout: float):
            super().__init__()
            d = r.width
            self.heads, self.dropout = r.heads, dropout
            self.ln1 = nn.LayerNorm(d, bias=False)
            self.qkv = nn.Linear(d, 3 * d, bias=False)
            self.proj = nn.Linear(d, d, bias=False)
            self.ln2 = nn.LayerNorm(d, bias=False)
            self.up = nn.Linear(d, 4 * d, bias=False)
            self.down = nn.Linear(4 * d, d, bias=False)
            self.drop = nn.Dropout(dropout)

        def attend(self, x_BTD):
            b, t, d = x_BTD.shape
            q, k, v = self.qkv(x_BTD).split(d, dim=2)
            # (B, T, D) -> (B, N, T, H)
            q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
            p = self.dropout if self.training else 0.0
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
            return self.drop(self.proj(y.transpose(1, 2).reshape(b, t, d)))

        def forward(self, x_BTD):
            x_BTD = x_BTD + self.attend(self.ln1(x_BTD))
            return x_BTD + self.drop(self.down(F.gelu(self.up(self.ln2(x_BTD)))))

    class PeerGPT(nn.Module):
        def __init__(self, r: Recipe, dropout: float, vocab: int = VOCAB):
            super().__init__()
            self.tok = nn.Embedding(vocab, r.width)
            self.pos = nn.Embedding(r.block, r.width)
            self.drop = nn.Dropout(dropout)
            self.blocks = nn.ModuleList(Block(r, dropout) for _ in range(r.layers))
            self.ln_f = nn.LayerNorm(r.width, bias=False)
            for name, p in self.named_parameters():
                if p.dim() == 2:
                    residual_out = name.endswith(("proj.weight", "down.weight"))
                    std = 0.02 / math.sqrt(2 * r.layers) if residual_out else 0.02
                    nn.init.normal_(p, 0.0, std)

        def logits(self, ids_BT):
            t = ids_BT.shape[1]
            x = self.drop(self.tok(ids_BT) + self.pos(torch.arange(t)))
            for block in self.blocks:
                x = block(x)
            return self.ln_f(x) @ self.tok.weight.T  # tied output projection

        def forward(self, ids_BT, targets_BT):
            logits = self.logits(ids_BT)
            return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets_BT.reshape(-1))

    return PeerGPT


def _adamw(torch, model):
    """AdamW as nanoGPT sets it up: decay on matrices only, fused if this torch has it."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    for kind in ("fused", "foreach"):
        try:
            opt = torch.optim.AdamW(groups, lr=1e-3, betas=(0.9, 0.99), **{kind: True})
            opt.zero_grad()
            return opt, kind
        except (RuntimeError, TypeError, ValueError):
            continue
    return torch.optim.AdamW(groups, lr=1e-3, betas=(0.9, 0.99)), "for-loop"


def peer_step(recipe: Recipe, dropout: float, compiled: bool):
    """One training step of the peer as a closure, and a note on its setup."""
    import torch

    torch.manual_seed(0)
    model = _peer_classes()(recipe, dropout)
    model.train()
    opt, kind = _adamw(torch, model)
    fwd = torch.compile(model) if compiled else model
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, VOCAB, (recipe.batch, recipe.block), generator=gen)
    targets = torch.randint(0, VOCAB, (recipe.batch, recipe.block), generator=gen)

    def run():
        loss = fwd(ids, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()  # nanoGPT reads the loss every step too (a sync on CPU anyway)

    return run, f"AdamW {kind}, torch {torch.__version__} ({torch.get_num_threads()} threads)"


# --------------------------------------------------------------------------- ours


def our_config(
    recipe: Recipe, dropout: float, rng_impl: str = "threefry2x32", attention_impl: str = "xla"
):
    """configs/lm_kjv.py overridden to the recipe: the config `train.main` would run."""
    from configs import lm_kjv

    config = lm_kjv.get_config()
    config.max_len = recipe.block
    config.batch_size = recipe.batch
    config.model.d_model = recipe.width
    config.model.num_heads = recipe.heads
    config.model.d_ff = 4 * recipe.width
    config.model.num_layers = recipe.layers
    config.model.use_bias = False  # projections, feed-forward and LayerNorm shift
    config.model.scale_embeddings = False  # GPT-2: no sqrt(d) on the token embeddings
    config.model.dropout_rate = dropout
    config.model.attention_dropout_rate = dropout
    config.learning_rate = 1e-3
    config.b2 = 0.99
    config.eps = 1e-8
    config.weight_decay = 0.1
    config.grad_clip_norm = 1.0
    config.rng_impl = rng_impl
    config.model.attention_impl = attention_impl
    config.num_train_steps = 5000
    return config


def our_step(
    recipe: Recipe,
    dropout: float,
    rng_impl: str = "threefry2x32",
    attention_impl: str = "xla",
    cpu_devices: int = 0,
):
    """Our jitted train step as `train_lib` builds and calls it, as a closure, on the CPU
    devices `train.main` would make (`cpu_devices`: 0 = auto, as its default)."""
    from train.core import distributed

    config = our_config(recipe, dropout, rng_impl, attention_impl)
    config.cpu_devices = cpu_devices
    distributed.split_cpu(config)  # before JAX starts, as train.main does

    import jax
    import numpy as np

    from train import tasks
    from train.config import config_lib
    from train.program import loop as train_lib
    from train.program import steps

    experiment = config_lib.validate_config(config)
    task = tasks.get_task("lm")
    mesh = train_lib.make_mesh(experiment.run.mesh_shape)
    program = train_lib.build_program(experiment, task, mesh, VOCAB, unk_id=1)
    box = [
        steps.create_train_state(
            program.model, task, program.tx, mesh, experiment.run.seed, rng_impl
        )
    ]
    rng = np.random.default_rng(0)
    # Ids from 1: 0 is our pad id, whose targets the loss leaves out.
    shape = (recipe.batch, recipe.block)
    batch = {
        "inputs": rng.integers(1, VOCAB, shape).astype(np.int32),
        "targets": rng.integers(1, VOCAB, shape).astype(np.int32),
    }

    def run():
        box[0], metrics = program.train_step(box[0], program.put_batch(batch))
        return float(metrics["loss"])  # train_lib's TrainLog reads it too (every log step)

    return run, (
        f"jax {jax.__version__}, rng {rng_impl}, attention {attention_impl}, "
        f"{jax.device_count()} {jax.default_backend()} device(s)"
    )


# --------------------------------------------------------------------------- driver


def _matmul_rate(variant: str) -> float:
    if variant.startswith("ours"):
        from benchmarks.common import matmul_peak_flops

        return matmul_peak_flops()
    import torch

    a = torch.randn(1024, 1024)
    return 2 * 1024**3 / median(time_steps(lambda: a @ a, 10))


def profile(variant: str, recipe_name: str, dropout: float, steps: int) -> dict:
    """Op time per step by class (`benchmarks.step_profile`'s classes) of one variant."""
    from benchmarks import step_profile

    recipe = RECIPES[recipe_name]
    if variant.startswith("ours"):
        run, _ = our_step(recipe, dropout)
        ops = step_profile.jax_ops(run, steps)
        return step_profile._summary(ops, step_profile._xla_class, steps)
    run, _ = peer_step(recipe, dropout, compiled=variant == "compile")
    ops = step_profile.torch_ops(run, steps)
    return step_profile._summary(ops, step_profile._torch_class, steps)


def worker(variant: str, recipe_name: str, dropout: float) -> None:
    """One variant, driven over stdin/stdout: a ready line, then `time K` -> K step times."""
    recipe = RECIPES[recipe_name]
    if variant.startswith("ours"):
        # ours[:rng_impl][+attention_impl][@cpu_devices], e.g. ours:rbg, ours+blocked, ours@1
        variant, _, devices = variant.partition("@")
        name, _, attention_impl = variant.partition("+")
        rng_impl = name.partition(":")[2] or "threefry2x32"
        run, note = our_step(recipe, dropout, rng_impl, attention_impl or "xla", int(devices or 0))
    else:
        # eager, compile, or with a thread count: eager@1 (torch.set_num_threads(1))
        kind, _, threads = variant.partition("@")
        if threads:
            import torch

            torch.set_num_threads(int(threads))
        run, note = peer_step(recipe, dropout, compiled=kind == "compile")
    time_steps(run, 0, warmup=3)  # compile (both) and first-touch allocations
    print(json.dumps({"note": note, "matmul": _matmul_rate(variant)}), flush=True)
    for line in sys.stdin:
        print(json.dumps(time_steps(run, int(line.split()[1]), warmup=0)), flush=True)


class _Worker(WorkerProcess):
    def __init__(self, variant: str, recipe: str, dropout: float):
        super().__init__(
            ["benchmarks.nanogpt_peer", "--worker", variant]
            + ["--recipe", recipe, "--dropout", str(dropout)]
        )


def _loadavg() -> str:
    return " ".join(open("/proc/loadavg").read().split()[:3])


def compare(variants: list[str], recipe: str, dropout: float, rounds: int, steps: int) -> dict:
    """Alternating rounds; per-round medians, and each variant's ratio to the first."""
    load_before = _loadavg()
    workers = {}
    try:
        for v in variants:  # built one at a time: compiles do not overlap
            workers[v] = _Worker(v, recipe, dropout)
        per_round = {v: [] for v in variants}
        for r in range(rounds):
            order = variants[r % len(variants) :] + variants[: r % len(variants)]
            for v in order:
                per_round[v].append(median(workers[v].time(steps)))
    finally:
        for w in workers.values():
            w.close()
    base = variants[0]
    ratios = {
        v: statistics.median(t / b for t, b in zip(per_round[v], per_round[base], strict=True))
        for v in variants[1:]
    }
    return {
        "recipe": recipe,
        "dropout": dropout,
        "rounds": rounds,
        "steps": steps,
        "ms": {v: [1e3 * t for t in ts] for v, ts in per_round.items()},
        "ratio_to_" + base: ratios,
        "matmul_gflops": {v: w.ready["matmul"] / 1e9 for v, w in workers.items()},
        "notes": {v: w.ready["note"] for v, w in workers.items()},
        "load": [load_before, _loadavg()],
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", default="cpu", choices=sorted(RECIPES))
    parser.add_argument("--dropout", default="0,0.2", help="comma-separated rates")
    parser.add_argument(
        "--variants",
        default="ours,eager,compile",
        help="the first is the baseline of the ratios: "
        "ours[:rng_impl][+attention_impl][@cpu_devices], eager[@threads], compile[@threads]",
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10, help="timed steps per round")
    parser.add_argument(
        "--profile", action="store_true", help="op time by class per variant, one at a time"
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.profile and args.worker:
        print(json.dumps(profile(args.worker, args.recipe, float(args.dropout), args.steps)))
        return
    if args.profile:
        for dropout in args.dropout.split(","):
            for v in args.variants.split(","):
                cmd = [sys.executable, "-m", "benchmarks.nanogpt_peer", "--profile"]
                cmd += ["--worker", v, "--recipe", args.recipe, "--dropout", dropout]
                cmd += ["--steps", str(args.steps)]
                done = subprocess.run(cmd, capture_output=True, text=True)
                out = done.stdout.strip().splitlines()[-1:] or [done.stderr[-300:]]
                print(f"{args.recipe} dropout {dropout} {v} (load {_loadavg()}): {out[0]}")
        return
    if args.worker:
        return worker(args.worker, args.recipe, float(args.dropout))
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    from benchmarks.common import machine_line

    print(f"# {machine_line()}; recipe {args.recipe}: {RECIPES[args.recipe]}", flush=True)
    variants = args.variants.split(",")
    for dropout in (float(d) for d in args.dropout.split(",")):
        result = compare(variants, args.recipe, dropout, args.rounds, args.steps)
        print(json.dumps(result), flush=True)
        ratios = result["ratio_to_" + variants[0]]
        cells = ", ".join(f"{v}/{variants[0]} {x:.2f}x" for v, x in ratios.items())
        medians = ", ".join(f"{v} {statistics.median(ms):.1f} ms" for v, ms in result["ms"].items())
        print(
            f"{args.recipe} dropout {dropout}: {cells} (step medians {medians}; load "
            f"{result['load'][0]} -> {result['load'][1]})",
            flush=True,
        )


if __name__ == "__main__":
    main()
