"""Host time per step of `train.main`'s loop at nanoGPT's CPU recipe, apart from the step.

    python -m benchmarks.loop_overhead [--steps 200] [--rounds 3]

Runs `train_lib.train_and_evaluate` on the KJV (byte tokenizer: no SentencePiece training)
with the model, optimizer and batch of `benchmarks.nanogpt_peer`'s CPU recipe, twice per
round in fresh work directories:

- as is: the mean interval between consecutive `step_callback` calls is what one step of
  the loop costs (jitted step, data, metrics, progress bar, with the loop's asynchronous
  dispatch);
- with the jitted train step wrapped to block on its result and time itself: the interval
  minus that blocked step time (medians over steps) is the host-side work of a step done
  serially (data, `put_batch`, `TrainLog.add`, the progress bar, the periodic metric fetch).

Steps that evaluate or save (the last) and the first steps (compilation) are left out; the
medians over the remaining steps are reported per round, with the load average.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import tempfile
import time

import jax

from benchmarks.common import machine_line
from benchmarks.nanogpt_peer import RECIPES, our_config
from train.program import loop as train_lib

SKIP = 5  # first steps left out (compilation, first touches)


def _config(steps: int):
    config = our_config(RECIPES["cpu"], 0.0)
    config.tokenizer = "byte"
    config.num_train_steps = steps
    config.eval_every_steps = steps
    config.checkpoint_every_steps = steps
    config.num_eval_batches = 1
    config.sample_prompts = ("In the beginning",)
    config.max_decode_len = 4
    config.warmup_steps = 10
    return config


def run_once(steps: int, blocked: bool) -> dict:
    """One training run; median loop interval and (if blocked) median step time, in ms."""
    stamps, step_times = [], []
    build = train_lib.build_program

    def build_timed(*args, **kwargs):
        program = build(*args, **kwargs)
        inner = program.train_step

        def timed(state, batch):
            start = time.perf_counter()
            out = jax.block_until_ready(inner(state, batch))
            step_times.append(time.perf_counter() - start)
            return out

        return dataclasses.replace(program, train_step=timed)

    if blocked:
        train_lib.build_program = build_timed
    try:
        with tempfile.TemporaryDirectory() as workdir:
            train_lib.train_and_evaluate(
                _config(steps), workdir, step_callback=lambda s: stamps.append(time.perf_counter())
            )
    finally:
        train_lib.build_program = build
    intervals = [b - a for a, b in zip(stamps[SKIP:-2], stamps[SKIP + 1 : -1], strict=True)]
    # The mean: with asynchronous dispatch most intervals are short and the metric fetch
    # every log_every_steps waits for the steps queued before it.
    out = {"loop_ms": 1e3 * statistics.mean(intervals)}
    if blocked:
        out["step_ms"] = 1e3 * statistics.median(step_times[SKIP + 1 : -1])
        host = [i - s for i, s in zip(intervals, step_times[SKIP + 1 : -1], strict=True)]
        out["host_ms"] = 1e3 * statistics.median(host)
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    print(f"# {machine_line()}; CPU recipe {RECIPES['cpu']}, {args.steps} steps per run")
    for r in range(args.rounds):
        load = " ".join(open("/proc/loadavg").read().split()[:3])
        plain = run_once(args.steps, blocked=False)
        timed = run_once(args.steps, blocked=True)
        print(
            f"round {r}: loop {plain['loop_ms']:.1f} ms/step as is; blocked: loop "
            f"{timed['loop_ms']:.1f}, step {timed['step_ms']:.1f}, host {timed['host_ms']:.2f} "
            f"ms/step ({100 * timed['host_ms'] / timed['loop_ms']:.1f}%); load {load}",
            flush=True,
        )


if __name__ == "__main__":
    main()
