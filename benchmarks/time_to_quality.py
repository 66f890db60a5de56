"""Time to quality of finished `train.main` runs, read from their metrics.jsonl (issue 51):
BLEU (or validation loss) against the run's clock, the time each reached a target, and a
PNG of the curves side by side (e.g. the default run's old and new recipes).

    python -m benchmarks.time_to_quality runs/old runs/new --bleu 64 --out benchmarks/default_bleu
    python -m benchmarks.time_to_quality runs/lm_a runs/lm_b --valid_loss 1.5

Two clocks, both from the records: `wall_s`, the seconds since the command started (start-up,
compilation, evaluations and checkpoints in), and the training clock, `wall_s` less the
evaluations so far (every record's `eval_s`: validation and BLEU), which is what a run
without interim evaluations would have taken to reach that step.
"""

from __future__ import annotations

import argparse
import json
import pathlib


def curve(run: pathlib.Path, split: str, key: str) -> list[dict]:
    """[{step, value, wall_s, train_s}] of the `split` records (`key` their value), the
    training clock less every evaluation up to and including the record's own."""
    records = [
        json.loads(line)
        for line in (run / "metrics.jsonl").read_text().splitlines()
        if line.strip()
    ]
    spent, points = 0.0, []
    for record in records:  # in file order: the order they happened
        spent += record.get("eval_s", 0.0)
        if record["split"] == split and key in record and "wall_s" in record:
            points.append(
                {
                    "step": record["step"],
                    "value": record[key],
                    "wall_s": record["wall_s"],
                    "train_s": record["wall_s"] - spent,
                }
            )
    return points


def first(points: list[dict], reached) -> dict | None:
    """The first point whose value `reached` says yes to, or None."""
    return next((p for p in points if reached(p["value"])), None)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="train.main work directories")
    parser.add_argument("--bleu", type=float, default=0.0, help="a BLEU target (translation)")
    parser.add_argument("--valid_loss", type=float, default=0.0, help="a validation loss target")
    parser.add_argument("--out", default="", help="path prefix of a PNG of the curves")
    args = parser.parse_args(argv)
    split, key = ("bleu", "bleu") if args.bleu or not args.valid_loss else ("valid", "nll")
    target = args.bleu or args.valid_loss
    reached = (lambda v: v >= target) if split == "bleu" else (lambda v: v <= target)
    curves = {run: curve(pathlib.Path(run), split, key) for run in args.runs}
    for run, points in curves.items():
        print(f"{run}: {split} {key} by step (wall s / training s)")
        for p in points:
            print(f"  {p['step']:>6}  {p['value']:8.3f}  {p['wall_s']:8.1f}  {p['train_s']:8.1f}")
        if target:
            hit = first(points, reached)
            where = (
                f"at step {hit['step']}: {hit['wall_s']:.1f} s wall, {hit['train_s']:.1f} s "
                "training"
                if hit
                else "not reached"
            )
            print(f"  target {key} {'>=' if split == 'bleu' else '<='} {target:g}: {where}")
    if args.out:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib import pyplot as plt

        fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
        for run, points in curves.items():
            for ax, clock in zip(axes, ("wall_s", "train_s"), strict=True):
                ax.plot([p[clock] for p in points], [p["value"] for p in points], ".-", label=run)
        for ax, label in zip(
            axes, ("seconds since the command started", "the same, evaluations left out"),
            strict=True,
        ):  # fmt: skip
            if target:
                ax.axhline(target, color="gray", linestyle="--")
            ax.set_xlabel(label)
            ax.grid(alpha=0.3)
        axes[0].set_ylabel(f"validation {key}")
        axes[0].legend()
        fig.tight_layout()
        path = pathlib.Path(args.out).with_suffix(".png")
        fig.savefig(path, dpi=100)
        print(f"curves: {path}")


if __name__ == "__main__":
    main()
