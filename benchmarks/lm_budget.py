"""Two language-model configs at the same wall-clock budget: validation bits per character.

    python -m benchmarks.lm_budget [--configs configs/lm_kjv.py,configs/lm_kjv_llama.py]
        [--budget-minutes 12] [--probe-steps 60] [--out runs/lm_budget]

A fair comparison of two decoders gives each the same time, not the same steps. Phase 1 runs
every config for a few steps, all at once (one process each, so each sees the same machine
load), and reads each one's training speed (tokens/s of the training steps, compile and
evaluation excluded) from its metrics. Phase 2 trains each config, again all at once, for
the steps its speed fits into the budget, with its schedule (warm-up, cosine decay) spread
over those steps, and prints the final validation bits/char and the wall time of each run.
Both phases run `python -m train.main` unchanged.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import pathlib
import shutil
import subprocess
import sys
import time

from benchmarks.common import machine_line


def _tokens_per_step(config_path: str) -> int:
    """Tokens in one training batch of a packed LM config (batch_size x max_len)."""
    spec = importlib.util.spec_from_file_location("budget_config", config_path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config()
    if config.packing != "stream" or config.task != "lm":
        raise SystemExit(f"{config_path}: lm_budget compares packed language-model configs.")
    return config.batch_size * config.max_len


def _run_all(jobs: dict[str, list[str]]) -> dict[str, float]:
    """Runs the train.main commands at once; returns each one's wall seconds."""
    started = time.perf_counter()
    procs = {
        name: subprocess.Popen(
            [sys.executable, "-m", "train.main", *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for name, args in jobs.items()
    }
    walls = {}
    while len(walls) < len(procs):
        for name, proc in procs.items():
            if name not in walls and proc.poll() is not None:
                walls[name] = time.perf_counter() - started
                if proc.returncode:
                    raise SystemExit(f"{name} failed with exit status {proc.returncode}.")
        time.sleep(0.5)
    return walls


def _records(workdir: pathlib.Path, split: str) -> list[dict]:
    lines = (workdir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["split"] == split]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", default="configs/lm_kjv.py,configs/lm_kjv_llama.py")
    parser.add_argument("--budget-minutes", type=float, default=12.0)
    parser.add_argument("--probe-steps", type=int, default=60)
    parser.add_argument("--out", default="runs/lm_budget")
    args = parser.parse_args(argv)
    configs = [c for c in args.configs.split(",") if c]
    out = pathlib.Path(args.out)
    names = {c: pathlib.Path(c).stem for c in configs}
    print(f"# machine: {machine_line()}; {len(configs)} runs at once in each phase")

    # Phase 1: training speed of each config under the same load.
    probe = {}
    for config in configs:
        workdir = out / f"probe_{names[config]}"
        shutil.rmtree(workdir, ignore_errors=True)
        steps = args.probe_steps
        probe[config] = [
            "--config",
            config,
            "--workdir",
            str(workdir),
            f"--config.num_train_steps={steps}",
            f"--config.log_every_steps={steps // 3}",
            f"--config.eval_every_steps={steps}",
            f"--config.checkpoint_every_steps={steps}",
            "--config.num_samples=0",
        ]
    _run_all(probe)
    steps_per_s = {}
    for config in configs:
        # The first logging window includes compilation: use the later ones.
        rates = [r["tokens_per_sec"] for r in _records(out / f"probe_{names[config]}", "train")]
        steps_per_s[config] = min(rates[1:] or rates) / _tokens_per_step(config)
        # min: the slowest window, so that the budget is not overrun

    # Phase 2: each config for the steps that fit the budget.
    budget_s = 60 * args.budget_minutes
    steps = {c: max(100, int(budget_s * steps_per_s[c])) for c in configs}
    jobs = {}
    for config in configs:
        workdir = out / names[config]
        shutil.rmtree(workdir, ignore_errors=True)
        third = max(1, steps[config] // 3)
        jobs[config] = [
            "--config",
            config,
            "--workdir",
            str(workdir),
            f"--config.num_train_steps={steps[config]}",
            f"--config.eval_every_steps={third}",
            f"--config.checkpoint_every_steps={steps[config]}",
        ]
    walls = _run_all(jobs)
    print(f"{'config':<16} {'steps/s':>8} {'steps':>6} {'wall min':>9} {'valid bits/char':>16}")
    for config in configs:
        final = _records(out / names[config], "valid")[-1]
        print(
            f"{names[config]:<16} {steps_per_s[config]:8.2f} {steps[config]:6d} "
            f"{walls[config] / 60:9.1f} {final['bits_per_char']:16.3f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
