"""How fast does the encoder-decoder learn to use its source? Validation BLEU against training
minutes for named recipes (docs/recipe_study.md).

    python -m benchmarks.recipe_study --recipe baseline --recipe emb1 --minutes 8
    python -m benchmarks.recipe_study --recipe emb1 --set corpus=bible --set bleu_tokenize=13a

Each recipe is the first default recipe (FIRST_RECIPE below) with a few fields changed
(RECIPES; `--set field=value` changes more for every recipe). A run trains in its own work
directory under `--out`, computes validation BLEU every `--bleu-every` steps, and appends
one JSON line per BLEU point to `--out/curves.jsonl`: recipe, corpus, step, training
minutes (steps times the recipe's measured seconds per step: evaluation and decoding are
left out, so recipes compare on what they spend learning), BLEU, chrF. `--time-only`
measures the seconds per step of the named recipes side by side (`--out/timings.json`);
`--plot` draws the curves of curves.jsonl, with minutes from timings.json where it has them.

The number of steps for a budget comes from a short timing run (`--minutes`), so a recipe's
cosine schedule ends when its budget does. Run one recipe at a time on a quiet machine:
two runs side by side share the cores and both slow down.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import pathlib
import platform
import tempfile
import time

from configs import default as default_config

# The first default recipe (configs/default.py before 2026-11-30, whose run ignored its
# source): every recipe below starts from configs/default.py with these fields, then
# changes its own. The study varies one thing at a time, then combines what helped.
FIRST_RECIPE = {
    "model.d_model": 256,
    "model.d_ff": 1024,
    "vocab_size": 8000,
    "copied_targets": 0.0,
}
RECIPES: dict[str, dict] = {
    "baseline": {},
    # Token embeddings std d**-0.5, i.e. std 1 after the sqrt(d) scale (Flax wmt example).
    "emb1": {"model.embed_init_std": 256**-0.5},
    # Projection kernels std d**-0.5 (the scale of the Xavier/LeCun init of the Flax wmt
    # example and tensor2tensor) instead of 0.02: attention scores start at unit scale.
    "kinit": {"model.init_std": 256**-0.5},
    "kinit+emb1": {"model.init_std": 256**-0.5, "model.embed_init_std": 256**-0.5},
    # Only examples up to 40 tokens (about half): is alignment learned faster on short ones?
    "short40": {"max_len": 40, "bucket_lengths": (16, 24, 40)},
    "copy0.5": {"copied_targets": 0.5},
    "copy1": {"copied_targets": 1.0},
    "wdrop0.2": {"target_token_dropout": 0.2},
    "wdrop0.4": {"target_token_dropout": 0.4},
    "lr1e-3": {"learning_rate": 1e-3},
    "lr4e-3": {"learning_rate": 4e-3},
    "tok1024": {"tokens_per_batch": 1024},
    "tok4096": {"tokens_per_batch": 4096},
    "tok512": {"tokens_per_batch": 512},
    "tok1024+v4k": {"tokens_per_batch": 1024, "vocab_size": 4000},
    "vocab4k": {"vocab_size": 4000},
    "vocab16k": {"vocab_size": 16000},
    "ls0": {"label_smoothing": 0.0},
    "post": {"model.norm_position": "post", "warmup_steps": 300},
    "untied": {"model.share_embeddings": False, "model.tie_output_embedding": False},
    "d128x3": {"model.d_model": 128, "model.d_ff": 512, "model.num_layers": 3},
    # A narrow model with a small vocabulary: ~4x fewer FLOPs per step, ~4x more steps.
    "d128+v4k": {"model.d_model": 128, "model.d_ff": 512, "vocab_size": 4000},
    "d128+v4k+copy0.5": {
        "model.d_model": 128,
        "model.d_ff": 512,
        "vocab_size": 4000,
        "copied_targets": 0.5,
    },
    "drop0.1": {"model.dropout_rate": 0.1},
}


# Recipes whose step has the same shapes and cost as another's (they change the data or the
# initialisation, not the arrays): their minutes use that recipe's timing.
SAME_COST = {
    "emb1": "baseline",
    "kinit": "baseline",
    "kinit+emb1": "baseline",
    "wdrop0.2": "baseline",
    "wdrop0.4": "baseline",
    "copy0.5": "baseline",
    "copy1": "baseline",
    "ls0": "baseline",
    "lr1e-3": "baseline",
    "lr4e-3": "baseline",
    "d128+v4k+copy0.5": "d128+v4k",
}


def _parse_value(text: str):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text  # a bare string such as corpus=kjv-web


def make_config(changes: dict):
    """configs/default.py with FIRST_RECIPE, then `changes` ({'field' or 'model.field':
    value}), applied."""
    config = default_config.get_config()
    with config.unlocked():
        for field, value in {**FIRST_RECIPE, **changes}.items():
            node, *rest = field.split(".")
            target = config[node] if rest else config
            target[rest[0] if rest else node] = value
    return config


class StepClock:
    """Wall-clock times at each step, taken by `train_and_evaluate`'s step callback.

    JAX dispatches steps asynchronously, so one step's interval means little; the loop waits
    for the device every `log_every_steps` (to log the loss), so the time between two such
    steps is the true time of the steps between them.
    """

    def __init__(self):
        self.times: dict[int, float] = {}

    def __call__(self, step: int) -> None:
        self.times[step] = time.perf_counter()


def time_steps(changes: dict, workdir: pathlib.Path, probe_steps: int) -> float:
    """Seconds per training step of a recipe, from a short run without compile time.

    The first third of the steps is left out: each bucket length compiles when first seen.
    """
    from train.program import loop as train_lib

    config = make_config(
        {
            **changes,
            "num_train_steps": probe_steps,
            "log_every_steps": 10,
            "bleu_examples": 0,
            "eval_every_steps": 10**6,
            "checkpoint_every_steps": 10**6,
        }
    )
    clock = StepClock()
    train_lib.train_and_evaluate(config, str(workdir), step_callback=clock)
    start = probe_steps // 3 - probe_steps // 3 % 10
    return (clock.times[probe_steps] - clock.times[start]) / (probe_steps - start)


def run_recipe(name, changes, args, out: pathlib.Path) -> None:
    from train.program import loop as train_lib

    workdir = out / f"{name}-{changes.get('corpus', 'bible')}"
    seconds = args.seconds_per_step
    if not seconds:
        with tempfile.TemporaryDirectory() as probe_dir:
            seconds = time_steps(changes, pathlib.Path(probe_dir), args.probe_steps)
    steps = max(args.bleu_every, int(args.minutes * 60 / seconds))
    steps -= steps % args.bleu_every
    print(f"[{name}] {seconds:.3f} s/step -> {steps} steps for {args.minutes} min", flush=True)
    config = make_config(
        {
            **changes,
            "num_train_steps": steps,
            "bleu_every_steps": args.bleu_every,
            "bleu_examples": args.bleu_examples,
            "eval_every_steps": args.bleu_every,
            "checkpoint_every_steps": steps,
        }
    )
    results = train_lib.train_and_evaluate(config, str(workdir))
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    with open(out / "curves.jsonl", "a") as f:
        for record in records:
            if record.get("split") != "bleu":
                continue
            point = {
                "recipe": name,
                "corpus": config.corpus,
                "step": record["step"],
                "minutes": round(record["step"] * seconds / 60, 2),
                "bleu": round(record["bleu"], 2),
                "chrf": round(record["chrf"], 2),
                "seconds_per_step": round(seconds, 4),
                "machine": f"{platform.processor() or platform.machine()}",
            }
            f.write(json.dumps(point) + "\n")
    print(f"[{name}] final BLEU {results['bleu']['bleu']:.2f}", flush=True)


def time_recipes(names, common, args, out: pathlib.Path) -> None:
    """Seconds per step of each recipe, measured one after the other in this process, and
    their ratio to the first; written to `out/timings.json`, which `plot` then uses for the
    minutes axis (so every curve's minutes come from one quiet, side-by-side measurement)."""
    timings = {}
    for name in names:
        with tempfile.TemporaryDirectory() as probe_dir:
            timings[name] = time_steps(
                {**RECIPES[name], **common}, pathlib.Path(probe_dir), args.probe_steps
            )
    first = timings[names[0]]
    for name, seconds in timings.items():
        print(f"{name}: {seconds:.3f} s/step ({first / seconds:.2f}x the steps/s of {names[0]})")
    path = out / "timings.json"
    saved = json.loads(path.read_text()) if path.exists() else {}
    saved.update({name: round(seconds, 4) for name, seconds in timings.items()})
    saved["machine"] = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"
    path.write_text(json.dumps(saved, indent=2) + "\n")


def plot(curves: pathlib.Path, png: pathlib.Path, copy_bleu: float | None = None) -> None:
    """Validation BLEU against training minutes, one line per recipe and corpus; a dashed
    line at `copy_bleu` (the copy-the-source baseline on the same verses) if given."""
    timings_path = curves.parent / "timings.json"
    timings = json.loads(timings_path.read_text()) if timings_path.exists() else {}
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points: dict[tuple[str, str], list] = {}
    for line in curves.read_text().splitlines():
        p = json.loads(line)
        seconds = timings.get(p["recipe"]) or timings.get(SAME_COST.get(p["recipe"], ""))
        minutes = p["step"] * seconds / 60 if seconds else p["minutes"]
        points.setdefault((p["corpus"], p["recipe"]), []).append((minutes, p["bleu"]))
    corpora = sorted({c for c, _ in points})
    fig, axes = plt.subplots(1, len(corpora), figsize=(6 * len(corpora), 4), squeeze=False)
    for ax, corpus in zip(axes[0], corpora, strict=True):
        for (c, recipe), xy in sorted(points.items()):
            if c == corpus:
                xs, ys = zip(*sorted(xy), strict=True)
                ax.plot(xs, ys, marker="o", label=recipe)
        if copy_bleu is not None:
            ax.axhline(copy_bleu, color="gray", linestyle="--", label="copy the source")
        ax.set(title=corpus, xlabel="training minutes (2-core CPU)", ylabel="validation BLEU")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", action="append", choices=sorted(RECIPES), default=[])
    parser.add_argument("--set", action="append", default=[], help="field=value for every recipe")
    parser.add_argument("--minutes", type=float, default=8.0, help="training budget per recipe")
    parser.add_argument("--bleu-every", type=int, default=150)
    parser.add_argument("--bleu-examples", type=int, default=200)
    parser.add_argument("--probe-steps", type=int, default=80)
    parser.add_argument(
        "--seconds-per-step",
        type=float,
        default=0.0,
        help="skip the timing run and use this (for recipes with the same shapes)",
    )
    parser.add_argument("--out", default="runs/recipe_study")
    parser.add_argument(
        "--time-only",
        action="store_true",
        help="only measure seconds per step of the recipes, side by side (timings.json)",
    )
    parser.add_argument("--copy-bleu", type=float, help="draw the copy baseline at this BLEU")
    parser.add_argument("--plot", help="write the curves of --out/curves.jsonl to this PNG")
    args = parser.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    common = {}
    for item in args.set:
        field, _, value = item.partition("=")
        common[field] = _parse_value(value)
    if args.time_only:
        time_recipes(args.recipe, common, args, out)
    else:
        for name in args.recipe:
            run_recipe(name, {**RECIPES[name], **common}, args, out)
    if args.plot:
        plot(out / "curves.jsonl", pathlib.Path(args.plot), args.copy_bleu)


if __name__ == "__main__":
    main()
