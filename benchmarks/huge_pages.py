"""Huge pages for XLA's host buffers: `python -m train.main` with and without glibc's
`glibc.malloc.hugetlb=1` (train.core.host_memory), alternating, each run a process of its own.

    python -m benchmarks.huge_pages                  # configs/default.py, 250 steps, 3 rounds
    python -m benchmarks.huge_pages --steps 400 --rounds 5 --config configs/lm_kjv.py

Each run trains the config for --steps steps (no evaluation, no BLEU, no checkpoint before
the end) in a fresh work directory; what is compared: the training steps per second after
the first --skip steps (read from the run's metrics.jsonl clock), the time to the first
step's record (start-up and compilation), the whole run's wall time, and the process's user
and system CPU seconds and minor page faults (getrusage of the child). The two variants
differ only in GLIBC_TUNABLES (`glibc.malloc.hugetlb=0`: no re-execution, glibc's default
4 KiB pages; `=1`: what `python -m train.<command>` now sets for itself). Prints a table
of medians and the per-round ratios; --json writes every run.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

from train.core.host_memory import thp_mode

VARIANTS = {"4k": "glibc.malloc.hugetlb=0", "huge": "glibc.malloc.hugetlb=1"}


def run_once(config: str, steps: int, skip: int, tunables: str, workdir: str) -> dict:
    env = dict(os.environ, GLIBC_TUNABLES=tunables)
    command = [
        sys.executable,
        "-m",
        "train.main",
        f"--config={config}",
        f"--workdir={workdir}",
        f"--config.num_train_steps={steps}",
        f"--config.eval_every_steps={steps}",
        f"--config.checkpoint_every_steps={steps}",
        f"--config.log_every_steps={skip}",
        "--config.bleu_every_steps=0",
        "--config.bleu_examples=0",  # every config has the field (all derive from default)
    ]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode:
        sys.exit(f"train.main failed ({done.returncode}):\n{done.stderr[-3000:]}")
    records = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
    train = {r["step"]: r["wall_s"] for r in records if r.get("split") == "train"}
    first, last = min(train), max(train)
    return {
        "wall_s": wall,
        "first_record_s": train[first],
        "steps_per_s": (last - first) / (train[last] - train[first]),
        "user_s": after.ru_utime - before.ru_utime,
        "sys_s": after.ru_stime - before.ru_stime,
        "minor_faults": after.ru_minflt - before.ru_minflt,
        "final_train_loss": next(r["loss"] for r in reversed(records) if r.get("split") == "train"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/default.py")
    parser.add_argument("--steps", type=int, default=250)
    parser.add_argument("--skip", type=int, default=50, help="steps before the rate is timed")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", help="write every run here")
    args = parser.parse_args()
    mode = thp_mode()
    print(
        f"transparent huge pages: {mode}; {args.config}, {args.steps} steps, "
        f"{args.rounds} rounds alternating"
    )
    if mode != "madvise":
        print("(the kernel's mode is not 'madvise': the tunable changes little or nothing here)")
    runs = {name: [] for name in VARIANTS}
    for round_index in range(args.rounds):
        for name, tunables in VARIANTS.items():
            with tempfile.TemporaryDirectory() as workdir:
                result = run_once(args.config, args.steps, args.skip, tunables, workdir)
            runs[name].append(result)
            print(
                f"round {round_index + 1} {name:>4}: "
                + ", ".join(f"{key} {value:.4g}" for key, value in result.items()),
                flush=True,
            )
    print()
    keys = list(runs["4k"][0])
    print(f"{'median':<18}" + "".join(f"{name:>14}" for name in VARIANTS) + f"{'huge / 4k':>12}")
    for key in keys:
        values = [statistics.median(r[key] for r in runs[name]) for name in VARIANTS]
        print(
            f"{key:<18}"
            + "".join(f"{v:>14.5g}" for v in values)
            + f"{values[1] / values[0]:>12.3f}"
        )
    ratios = [
        h["steps_per_s"] / k["steps_per_s"] for k, h in zip(runs["4k"], runs["huge"], strict=True)
    ]
    print("steps/s huge / 4k per round: " + ", ".join(f"{r:.3f}" for r in ratios))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "config": args.config,
                    "steps": args.steps,
                    "thp_mode": mode,
                    "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                    "load": os.getloadavg(),
                    "runs": runs,
                },
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
