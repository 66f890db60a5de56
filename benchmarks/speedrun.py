"""Time to quality on the char-level KJV task (issue 51, item 2): our training program
against the nanoGPT-style PyTorch peer, validation loss against wall time, in one run.

    python -m benchmarks.speedrun --rounds 3                            # baseline vs the peer
    python -m benchmarks.speedrun --rounds 3 --recipe baseline,muon,speedrun
    python -m benchmarks.speedrun --rounds 3 --recipe muon+muon_learning_rate=0.04
    python -m benchmarks.speedrun --rounds 3 --ablation                 # each change, all
    python -m benchmarks.speedrun --steps 20 --evals 2 --rounds 1 --out /tmp/smoke  # smoke

Task: benchmarks/char_lm.py's, the shipped KJV one verse a line, the first 90% of its
characters to train, the last 10% to validate, whole (every 64-byte window of the tail,
`--config.num_eval_batches=0`); the byte tokenizer (ids b + 4, BOS and EOS around each file).

The peer: benchmarks/nanogpt_peer.py's `PeerGPT` (nanoGPT's model: 4 layers, 128 wide, 4
heads, GELU MLP 4x, pre-LN without biases, learned positions, tied embeddings, normal(0.02)
init with scaled output projections) trained as nanoGPT's CPU command trains
shakespeare_char: 64-token windows at random offsets of the training bytes, 12 a step, 2,000
steps, AdamW lr 1e-3 (b2 0.99, weight decay 0.1 on matrices, fused where torch has it),
warm-up 100 then cosine to 1e-4 at the last step, clipping at 1, no dropout, torch eager
(nanoGPT's `--compile=False` on CPU). It is evaluated on the same windows as ours
(`validation_windows`; PEER_EVAL_ROWS at a time), its loss the mean over every validation
byte. Its final validation loss (median over the rounds) is the target.

Ours: `train_lib.train_and_evaluate` as `python -m train.main` runs it, on char_lm.recipe's
config (nanoGPT's recipe on our model) changed by a recipe (`RECIPES`; `a+b` applies both),
on the CPU devices train.main would make; its curve is read from the run's metrics.jsonl.

Clocks. Every run is a process of its own, started by this one, and counts from the moment
it was started (the time is passed on its command line): Python's start-up, the imports,
reading the data and compilation count, for both. Both evaluate at the same steps
(`--evals` points, and the last step) and record each evaluation's seconds (`eval_s`); the
curves and the table use the training clock, wall time less the evaluations so far (the
speedrun's convention: the clock stops during validation), and the table also gives the
wall clock with the evaluations in. Rounds alternate: each runs the peer and every recipe
once, one process at a time, in an order that rotates per round, so all see the same load;
the table gives medians over the rounds. The JSON (`--out`.json) holds every curve, the PNG
(`--out`.png) draws them.

`--ablation` runs the baseline, each change of `--recipe` (default `ABLATION`) alone, and all
of them together (`all`), and prints the ablation table: time to the target, and the final
validation loss.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import pathlib
import shutil
import statistics
import sys
import time

from benchmarks.processes import WorkerProcess

ROOT = pathlib.Path(__file__).resolve().parent.parent
BYTE_OFFSET, BOS, EOS, PAD = 4, 1, 2, 0  # train.data.tokenizer.ByteTokenizer's ids
BYTE_VOCAB = BYTE_OFFSET + 256
PEER = "peer"
# Windows the peer scores at a time. Eager torch at our 12 rows took a minute per pass over
# the tail on a loaded 2-core machine; the loss does not depend on it, and the curves' clock
# leaves evaluations out (the wall clock, evaluations in, counts each side's own choice).
PEER_EVAL_ROWS = 128

# nanoGPT's shakespeare_char schedule (train.py's get_lr with that config): warm-up over
# 100 iterations to 1e-3, cosine to 1e-4 at lr_decay_iters (= max_iters in the CPU command).
PEER_LR, PEER_MIN_LR, PEER_WARMUP = 1e-3, 1e-4, 100


def _batch24(steps: int) -> dict:
    """Twice the rows for half the steps (the same tokens), rate times sqrt 2."""
    return {
        "batch_size": 24,
        "num_train_steps": max(steps // 2, 1),
        "warmup_steps": 50,
        "learning_rate": 1e-3 * math.sqrt(2),
    }


# Recipes: config overrides on benchmarks/char_lm.py's `recipe` (nanoGPT's on our model),
# each a dict or a function of --steps giving one. Starting points for the measurement, not
# tuned values: the ablation and the curves choose.
RECIPES = {
    "baseline": ("nanoGPT's CPU recipe on our model (benchmarks/char_lm.py)", {}),
    "muon": (
        "Muon (lr 0.02, momentum 0.95) for the layers' matrices, AdamW for the rest",
        {"optimizer": "muon", "muon_learning_rate": 0.02},
    ),
    "schedule_free": (
        "schedule-free AdamW, constant rate 2e-3 after the warm-up",
        {"optimizer": "schedule_free_adamw", "schedule": "constant", "learning_rate": 2e-3},
    ),
    "rope_rmsnorm": (
        "rotary positions and RMSNorm",
        {"model.positional": "rope", "model.norm": "rmsnorm"},
    ),
    "swiglu": (
        "SwiGLU feed-forward, d_ff 344 (the parameters of 512)",
        {
            "model.activation": "swiglu",
            "model.d_ff": 344,
        },
    ),  # fmt: skip
    "llama": (
        "rope, RMSNorm and SwiGLU (d_ff 344)",
        {
            "model.positional": "rope",
            "model.norm": "rmsnorm",
            "model.activation": "swiglu",
            "model.d_ff": 344,
        },
    ),  # fmt: skip
    "qk_norm": ("QK-norm", {"model.qk_norm": True}),
    "relu2": ("ReLU squared feed-forward", {"model.activation": "relu2"}),
    "soft_cap": ("logit soft-capping at 15", {"model.logits_soft_cap": 15.0}),
    "untied": ("an untied output head", {"model.tie_output_embedding": False}),
    "batch24": ("24 rows a step for half the steps, rate x sqrt 2, warm-up 50", _batch24),
    "short": (
        "the cosine over 60% of the steps",
        lambda steps: {
            "num_train_steps": max(3 * steps // 5, 1),
        },
    ),  # fmt: skip
    "warmup20": ("warm-up over 20 steps", {"warmup_steps": 20}),
    "cpu1": ("one CPU device (no split of the cores)", {"cpu_devices": 1}),
    "l2": ("2 layers", {"model.num_layers": 2}),
    "d192_l3": (
        "3 layers 192 wide (d_ff 768)",
        {
            "model.d_model": 192,
            "model.d_ff": 768,
            "model.num_layers": 3,
        },
    ),  # fmt: skip
}
# The modded-nanogpt speedrun's changes that the library has, one at a time in --ablation.
ABLATION = ("muon", "rope_rmsnorm", "qk_norm", "relu2", "soft_cap", "untied")
RECIPES["speedrun"] = ("all of " + ", ".join(ABLATION), "+".join(ABLATION))
# The recipe the measurement chose (benchmarks/RESULTS.md, "Time to quality"): the ablation's
# three changes that helped, at twice the rows for half the steps.
RECIPES["fast"] = (
    "Muon, rope + RMSNorm, ReLU squared, 24 rows for half the steps",
    "muon+rope_rmsnorm+relu2+batch24",
)


def recipe_overrides(name: str, steps: int) -> dict:
    """The config overrides of a recipe name, or of `a+b+...` (all applied). A part
    `field=value` (e.g. `muon+muon_learning_rate=0.04`, `baseline+model.d_ff=768`) sets one
    config field after the named parts, its value read as a Python literal (else a string):
    the way to try a value without adding a recipe.

    Raises:
        ValueError: an unknown name, or two named parts that set one field differently.
    """
    import ast

    merged: dict = {}
    fields = [part for part in name.split("+") if "=" in part]
    for part in name.split("+"):
        if "=" in part:
            continue
        if part not in RECIPES:
            raise ValueError(f"--recipe {part!r}: not one of {sorted(RECIPES)}")
        overrides = RECIPES[part][1]
        if isinstance(overrides, str):  # another expression
            overrides = recipe_overrides(overrides, steps)
        elif callable(overrides):
            overrides = overrides(steps)
        for key, value in overrides.items():
            if key in merged and merged[key] != value:
                raise ValueError(
                    f"--recipe {name!r}: {key} is {merged[key]!r} in one part, {value!r} in "
                    "another; combine recipes that set different fields."
                )
            merged[key] = value
    for part in fields:
        key, _, text = part.partition("=")
        try:
            merged[key] = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            merged[key] = text
    return merged


# --------------------------------------------------------------------------- the data


def byte_stream(path: pathlib.Path):
    """A file as our program reads it for the LM (one verbatim document, byte tokenizer):
    BOS, each UTF-8 byte b as b + 4, EOS; int64 numpy."""
    import numpy as np

    data = np.frombuffer(path.read_text(encoding="utf-8").encode("utf-8"), np.uint8)
    return np.concatenate([[BOS], data.astype(np.int64) + BYTE_OFFSET, [EOS]])


def validation_windows(path: pathlib.Path, length: int):
    """(inputs, targets), each `(W, length)`: the stream of `path` cut into windows as our
    'stream' packing cuts validation (`train.data.packing.stream_batches`): window k reads
    stream[k T : k T + T] and predicts stream[k T + 1 : k T + T + 1]; the last is padded
    with PAD, whose targets are not scored."""
    import numpy as np

    stream = byte_stream(path)
    windows = -(-(len(stream) - 1) // length)
    padded = np.full(windows * length + 1, PAD, np.int64)
    padded[: len(stream)] = stream
    inputs = padded[:-1].reshape(windows, length)
    targets = padded[1:].reshape(windows, length)
    return inputs, targets


# --------------------------------------------------------------------------- the workers


def peer_lr(it: int, steps: int) -> float:
    """nanoGPT's get_lr for iteration `it` (from 0) with lr_decay_iters = steps."""
    if it < PEER_WARMUP:
        return PEER_LR * (it + 1) / (PEER_WARMUP + 1)
    if it > steps:
        return PEER_MIN_LR
    ratio = (it - PEER_WARMUP) / max(steps - PEER_WARMUP, 1)
    return PEER_MIN_LR + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (PEER_LR - PEER_MIN_LR)


def _peer_run(args, train_file, valid_file) -> dict:
    """nanoGPT's CPU recipe on the bytes (module docstring); the curve on its clock."""
    import torch
    import torch.nn.functional as F

    from benchmarks.nanogpt_peer import RECIPES as PEER_RECIPES
    from benchmarks.nanogpt_peer import _adamw, _peer_classes

    recipe = PEER_RECIPES["cpu"]
    data = torch.from_numpy(byte_stream(train_file))
    inputs, targets = (torch.from_numpy(a) for a in validation_windows(valid_file, recipe.block))
    torch.manual_seed(0)
    model = _peer_classes()(recipe, 0.0, vocab=BYTE_VOCAB)
    model.train()
    opt, kind = _adamw(torch, model)
    every = max(args.steps // args.evals, 1)
    curve = []

    def evaluate() -> float:
        model.eval()
        total, count = 0.0, 0
        with torch.no_grad():
            for start in range(0, len(inputs), PEER_EVAL_ROWS):
                x, y = (
                    inputs[start : start + PEER_EVAL_ROWS],
                    targets[start : start + PEER_EVAL_ROWS],
                )
                logits = model.logits(x)
                nll = F.cross_entropy(
                    logits.view(-1, BYTE_VOCAB), y.reshape(-1), ignore_index=PAD, reduction="sum"
                )
                total, count = total + float(nll), count + int((y != PAD).sum())
        model.train()
        return total / count

    for it in range(args.steps):
        for group in opt.param_groups:
            group["lr"] = peer_lr(it, args.steps)
        ix = torch.randint(len(data) - recipe.block, (recipe.batch,))
        x = torch.stack([data[i : i + recipe.block] for i in ix])
        y = torch.stack([data[i + 1 : i + 1 + recipe.block] for i in ix])
        loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()  # nanoGPT's CPU command logs every iteration
        step = it + 1
        if step % every == 0 or step == args.steps:
            begun = time.time()
            nll = evaluate()
            now = time.time()
            curve.append(
                {"step": step, "loss": nll, "wall_s": now - args.launched, "eval_s": now - begun}
            )
    note = f"torch {torch.__version__} eager, {torch.get_num_threads()} threads, AdamW {kind}"
    return {"curve": curve, "steps": args.steps, "note": note}


def _ours_run(args, train_file, valid_file) -> dict:
    """`train_and_evaluate` on char_lm's config with the recipe's overrides; its curve from
    the run's metrics.jsonl (every record's wall_s counts from the launch)."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    sys.path.insert(0, str(ROOT))
    from benchmarks import char_lm

    config = char_lm.recipe(args.steps, train_file, valid_file)
    from train.core.cli import RENAMED_FIELDS

    for key, value in recipe_overrides(args.recipe, args.steps).items():
        *parents, leaf = RENAMED_FIELDS.get(key, key).split(".")  # old names read as today's
        target = config
        for parent in parents:
            target = target[parent]
        target[leaf] = value
    config.eval_every_steps = max(config.num_train_steps // args.evals, 1)
    config.checkpoint_every_steps = config.num_train_steps
    config.sample_prompts = ()  # nothing generated after the last evaluation
    from train.core import distributed

    distributed.split_cpu(config)  # the CPU devices train.main would make, before jax starts
    import jax

    from train.core.rundir import RunDir
    from train.program import loop as train_lib
    from train.program import metrics

    with contextlib.redirect_stdout(sys.stderr):  # stdout carries the one result line
        results = train_lib.train_and_evaluate(config, args.run_dir, started=args.launched)
    records = metrics.read_metrics(RunDir(args.run_dir).metrics)
    curve = [
        {"step": r["step"], "loss": r["nll"], "wall_s": r["wall_s"], "eval_s": r["eval_s"]}
        for r in records
        if r["split"] == "valid"
    ]
    note = f"jax {jax.__version__}, {jax.device_count()} {jax.default_backend()} device(s)"
    return {"curve": curve, "steps": results["step"], "note": note}


def worker(args) -> None:
    """One run (the peer, or ours with a recipe); prints its result as one JSON line."""
    data = pathlib.Path(args.workdir) / "data"
    train_file, valid_file = data / "kjv_train.txt", data / "kjv_valid.txt"
    run = _peer_run if args.worker == PEER else _ours_run
    result = run(args, train_file, valid_file)
    print(json.dumps(result), flush=True)


# --------------------------------------------------------------------------- the driver


def _launch(who: str, args, round_index: int) -> dict:
    """Runs `who` (PEER or a recipe) in a process of its own; its result and total time."""
    run_dir = pathlib.Path(args.workdir) / f"round{round_index}" / who.replace("+", "_")
    shutil.rmtree(run_dir, ignore_errors=True)  # a fresh run, never a resumed one
    launched = time.time()
    command = ["benchmarks.speedrun", "--worker", PEER if who == PEER else "ours"]
    command += ["--recipe", who, "--launched", repr(launched), "--run_dir", str(run_dir)]
    command += ["--steps", str(args.steps), "--evals", str(args.evals)]
    command += ["--workdir", str(args.workdir)]
    process = WorkerProcess(command)
    process.close()
    return {**process.ready, "process_s": time.time() - launched}


def training_clock(curve: list[dict]) -> list[float]:
    """Each point's seconds less the evaluations up to it (its own included): when
    training reached that step."""
    spent, clock = 0.0, []
    for point in curve:
        spent += point["eval_s"]
        clock.append(point["wall_s"] - spent)
    return clock


def _clock(curve: list[dict], kind: str) -> list[float]:
    return training_clock(curve) if kind == "train" else [p["wall_s"] for p in curve]


def time_to(curve: list[dict], target: float, kind: str = "train") -> float | None:
    """The clock at the first evaluation whose loss is at most `target`, or None."""
    for point, clock in zip(curve, _clock(curve, kind), strict=True):
        if point["loss"] <= target:
            return clock
    return None


def loss_at(curve: list[dict], seconds: float, kind: str = "train") -> float | None:
    """The loss of the last evaluation at or before `seconds` on the clock, or None."""
    losses = [p["loss"] for p, c in zip(curve, _clock(curve, kind), strict=True) if c <= seconds]
    return losses[-1] if losses else None


def _median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def summarise(runs: dict[str, list[dict]]) -> dict:
    """The target (the peer's median final loss) and, per recipe, medians over rounds."""
    peers = runs[PEER]
    target = statistics.median(p["curve"][-1]["loss"] for p in peers)
    peer_train = [training_clock(p["curve"])[-1] for p in peers]
    peer_wall = [p["curve"][-1]["wall_s"] for p in peers]
    out = {
        "target": target,
        PEER: {
            "final_loss": target,
            "train_s": statistics.median(peer_train),
            "wall_s": statistics.median(peer_wall),
        },
    }
    for who, results in runs.items():
        if who == PEER:
            continue
        to_target = [time_to(r["curve"], target) for r in results]
        to_target_wall = [time_to(r["curve"], target, "wall") for r in results]
        out[who] = {
            "reached": sum(t is not None for t in to_target),
            "rounds": len(results),
            "to_target_s": _median(to_target),
            "to_target_wall_s": _median(to_target_wall),
            "ratio_to_peer": _median(
                [None if t is None else t / p for t, p in zip(to_target, peer_train, strict=True)]
            ),
            "ratio_to_peer_wall": _median(
                [
                    None if t is None else t / p
                    for t, p in zip(to_target_wall, peer_wall, strict=True)
                ]
            ),
            "loss_at_peer_time": _median(
                [loss_at(r["curve"], p) for r, p in zip(results, peer_train, strict=True)]
            ),
            "final_loss": _median([r["curve"][-1]["loss"] for r in results]),
            "train_s": _median([training_clock(r["curve"])[-1] for r in results]),
        }
    return out


def _cell(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def table(summary: dict, names: list[str]) -> str:
    """The Markdown table of a summary: the peer's line, then one per recipe."""
    peer = summary[PEER]
    lines = [
        f"Target: the peer's final validation loss, {summary['target']:.4f} nats/byte "
        f"(median); the peer's training clock {peer['train_s']:.1f} s, wall clock "
        f"{peer['wall_s']:.1f} s (evaluations in).",
        "",
        "| run | reached | to target (s) | x peer's time | to target, wall (s) "
        "| x peer's wall | loss at peer's time | final loss | training clock (s) |",
        "|---|---|---|---|---|---|---|---|---|",
        f"| peer (nanoGPT, torch) | - | - | 1 | - | 1 | {summary['target']:.4f} "
        f"| {summary['target']:.4f} | {peer['train_s']:.1f} |",
    ]
    for who in names:
        s = summary[who]
        lines.append(
            f"| {who} | {s['reached']}/{s['rounds']} | {_cell(s['to_target_s'], '.1f')} "
            f"| {_cell(s['ratio_to_peer'], '.2f')} | {_cell(s['to_target_wall_s'], '.1f')} "
            f"| {_cell(s['ratio_to_peer_wall'], '.2f')} "
            f"| {_cell(s['loss_at_peer_time'], '.4f')} | {_cell(s['final_loss'], '.4f')} "
            f"| {_cell(s['train_s'], '.1f')} |"
        )
    return "\n".join(lines)


def plot(runs: dict[str, list[dict]], summary: dict, path: pathlib.Path) -> None:
    """Validation loss against the training clock, every round's curve, and the target."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (who, results) in enumerate(runs.items()):
        color = "black" if who == PEER else colors[i % len(colors)]
        label = "peer (nanoGPT recipe, torch)" if who == PEER else f"ours: {who}"
        for r, result in enumerate(results):
            losses = [p["loss"] for p in result["curve"]]
            ax.plot(
                training_clock(result["curve"]),
                losses,
                color=color,
                marker=".",
                alpha=0.8,
                label=label if r == 0 else None,
            )
    ax.axhline(summary["target"], color="gray", linestyle="--", label="target")
    ax.set_xlabel("seconds since the process started, evaluations excluded")
    ax.set_ylabel("validation loss (nats per byte)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _loadavg() -> str:
    try:
        return " ".join(open("/proc/loadavg").read().split()[:3])
    except OSError:
        return "?"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=2000, help="the peer's (and baseline's)")
    parser.add_argument("--evals", type=int, default=20, help="evaluations per run, spread")
    parser.add_argument(
        "--recipe",
        default=None,
        help=f"comma-separated recipes, each a name or a+b (default baseline; with --ablation "
        f"the changes, default {','.join(ABLATION)}); names: {', '.join(RECIPES)}",
    )
    parser.add_argument("--ablation", action="store_true")
    parser.add_argument("--workdir", default="/tmp/speedrun")
    parser.add_argument(
        "--out", default=None, help="path prefix of the .json and .png (default benchmarks/"
        "speedrun, or benchmarks/speedrun_ablation)",
    )  # fmt: skip
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--launched", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--run_dir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args)

    if args.ablation:
        changes = (args.recipe or ",".join(ABLATION)).split(",")
        names = ["baseline", *changes, "+".join(changes)]
    else:
        names = (args.recipe or "baseline").split(",")
    for name in names:
        recipe_overrides(name, args.steps)  # an unknown or contradictory recipe: now
    out = pathlib.Path(
        args.out or ROOT / "benchmarks" / ("speedrun_ablation" if args.ablation else "speedrun")
    )
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    sys.path.insert(0, str(ROOT))
    from benchmarks import char_lm

    char_lm.write_split(pathlib.Path(args.workdir) / "data")
    load_before = _loadavg()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    everyone = [PEER, *names]
    runs: dict[str, list[dict]] = {who: [] for who in everyone}
    for r in range(args.rounds):
        order = everyone[r % len(everyone) :] + everyone[: r % len(everyone)]
        for who in order:
            result = _launch(who, args, r)
            runs[who].append(result)
            last = result["curve"][-1]
            print(
                f"round {r + 1}/{args.rounds} {who}: loss {last['loss']:.4f} after "
                f"{result['steps']} steps, {training_clock(result['curve'])[-1]:.1f} s "
                f"training, {last['wall_s']:.1f} s wall (load {_loadavg()})",
                flush=True,
            )
    summary = summarise(runs)
    import platform

    report = {
        "command": " ".join(["python -m benchmarks.speedrun", *(argv or sys.argv[1:])]),
        "date": started,
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
        "load": [load_before, _loadavg()],
        "steps": args.steps,
        "evals": args.evals,
        "recipes": {n: recipe_overrides(n, args.steps) for n in names},
        "notes": {who: results[0]["note"] for who, results in runs.items()},
        "summary": summary,
        "runs": runs,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
    plot(runs, summary, out.with_suffix(".png"))
    print(f"# {report['machine']}, {started}, load {load_before} -> {_loadavg()}")
    print(table(summary, names))
    print(f"curves: {out.with_suffix('.json')}, {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
