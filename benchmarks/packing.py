"""Packed vs length-bucketed batches on the default run: non-padding tokens per second.

    python -m benchmarks.packing [--rounds 8] [--steps 8] [--workdir runs/default]

Both batchings come from the training program itself (`in_memory.build_dataset` with
configs/default.py, `packing='none'` and `packing='segments'`) and feed the same jitted
train step of the default model (`steps.jit_steps`), in one process. Each kind is first
compiled for every batch shape it has (four buckets; one packed shape), then the two take
turns, `--rounds` rounds of `--steps` steps each, the order flipped every round so that
neither always follows the other. A round's rate is the non-padding tokens of its batches
over the wall time of its steps (placing the batch on the device, the step, and waiting for
its metrics); the printed rate is the median over rounds, and the ratio is packed over
bucketed. A second estimate, less sensitive to which buckets a few rounds happen to draw:
every batch shape is timed again, in turn, `--steps` times, and an epoch's time is the sum
over its batches of their shape's median step; both kinds' epochs hold the same examples,
so the ratio of epoch times is the ratio of non-padding tokens per second. Padding
fractions are over the whole first epoch.

The SentencePiece model is read from `--workdir` if a run cached it there (runs/default
after `python -m train.main`), else trained once and cached there (about a minute).
"""

from __future__ import annotations

import argparse
import collections
import itertools
import statistics
import time

import jax
import numpy as np

from benchmarks.common import machine_line
from configs import default
from flax_transformer import sharding as sharding_lib
from train.config import config_lib
from train.core.rundir import RunDir
from train.data import epoch_stream
from train.data.pipeline import in_memory
from train.program import loop as train_lib
from train.program import steps
from train.tasks import get_task

KINDS = ("bucketed", "packed")
PACKING = {"bucketed": "none", "packed": "segments"}


def _sides(task) -> tuple[str, str]:
    """The batch keys of the source (model input) and target (label) tokens."""
    return task.model_inputs[0], "tgt_out" if task.name == "translation" else "targets"


def padding_fractions(batches, task) -> dict[str, float]:
    """Share of padding among the source and target slots of the batches."""
    out = {}
    for name, key in zip(("src", "tgt"), _sides(task), strict=True):
        slots = sum(b[key].size for b in batches)
        out[name] = 1.0 - sum(np.count_nonzero(b[key]) for b in batches) / slots
    return out


def non_pad_tokens(batch, task) -> tuple[int, int]:
    """Non-padding (source, target) tokens of a batch."""
    return tuple(int(np.count_nonzero(batch[key])) for key in _sides(task))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8, help="Timed rounds of each kind.")
    parser.add_argument("--steps", type=int, default=8, help="Training steps per round.")
    parser.add_argument("--workdir", default="runs/default", help="SentencePiece cache.")
    args = parser.parse_args()

    experiments, datasets, epochs = {}, {}, {}
    run = RunDir(args.workdir)
    for kind in KINDS:
        config = default.get_config()
        config.packing = PACKING[kind]
        experiments[kind] = config_lib.validate_config(config)
        datasets[kind] = in_memory.build_dataset(
            experiments[kind].data,
            run,
            task=get_task(experiments[kind].data.task),
            seed=config.seed,
        )
        epochs[kind] = datasets[kind].build_epoch(epoch_stream.epoch_rng(0, 0))
    experiment, dataset = experiments["bucketed"], datasets["bucketed"]
    task = dataset.task
    mesh = sharding_lib.make_mesh(*experiment.run.mesh_shape)
    program = train_lib.build_program(
        experiment, task, mesh, dataset.tokenizer.vocab_size, unk_id=dataset.tokenizer.unk_id
    )
    state = steps.create_train_state(
        program.model, task, program.tx, mesh, experiment.run.seed, experiment.run.rng_impl
    )
    train_step, put_batch = program.train_step, program.put_batch

    def step(batch) -> float:
        nonlocal state
        start = time.perf_counter()
        state, metrics = train_step(state, put_batch(batch))
        jax.block_until_ready(metrics)
        return time.perf_counter() - start

    compile_s = {}
    for kind in KINDS:  # one batch of every shape, untimed
        shapes = {b[task.model_inputs[0]].shape: b for b in epochs[kind]}
        start = time.perf_counter()
        for batch in shapes.values():
            step(batch)
        compile_s[kind] = time.perf_counter() - start

    streams = {kind: itertools.cycle(epochs[kind]) for kind in KINDS}
    rates = {kind: [] for kind in KINDS}  # (src + tgt, tgt) non-pad tokens/s per round
    seconds = {kind: [] for kind in KINDS}
    for round_index in range(args.rounds):
        order = KINDS if round_index % 2 == 0 else KINDS[::-1]
        for kind in order:
            elapsed, src, tgt = 0.0, 0, 0
            for _ in range(args.steps):
                batch = next(streams[kind])
                elapsed += step(batch)
                s, t = non_pad_tokens(batch, task)
                src, tgt = src + s, tgt + t
            rates[kind].append(((src + tgt) / elapsed, tgt / elapsed))
            seconds[kind].append(elapsed / args.steps)

    shape_seconds = collections.defaultdict(list)  # (kind, shape) -> seconds per step
    examples = {(kind, b[task.model_inputs[0]].shape): b for kind in KINDS for b in epochs[kind]}
    for _ in range(args.steps):
        for key, batch in examples.items():
            shape_seconds[key].append(step(batch))
    epoch_s = {
        kind: sum(
            statistics.median(shape_seconds[kind, b[task.model_inputs[0]].shape])
            for b in epochs[kind]
        )
        for kind in KINDS
    }

    print(machine_line())
    data = experiment.data
    print(
        f"default config (KJV -> WEB, SentencePiece {data.vocab_size}, max_len "
        f"{data.max_len}, buckets {data.bucket_lengths}, tokens_per_batch "
        f"{data.tokens_per_batch}); {args.rounds} rounds x {args.steps} steps each"
    )
    medians = {}
    for kind in KINDS:
        pad = padding_fractions(epochs[kind], task)
        shapes = sorted({b[task.model_inputs[0]].shape for b in epochs[kind]})
        medians[kind] = [statistics.median(r[i] for r in rates[kind]) for i in range(2)]
        print(
            f"{kind:9s} non-pad tokens/s {medians[kind][0]:8.0f} (target {medians[kind][1]:7.0f}),"
            f" step {1e3 * statistics.median(seconds[kind]):6.1f} ms, padding src "
            f"{100 * pad['src']:4.1f}% tgt {100 * pad['tgt']:4.1f}%, {len(epochs[kind])} "
            f"batches/epoch, shapes {shapes}, compile {compile_s[kind]:.1f} s"
        )
    ratio = medians["packed"][0] / medians["bucketed"][0]
    target_ratio = medians["packed"][1] / medians["bucketed"][1]
    print(f"packed / bucketed: {ratio:.2f}x non-pad tokens/s ({target_ratio:.2f}x target tokens)")
    steps_line = ", ".join(
        f"{kind} {shape[0]}x{shape[1]} {1e3 * statistics.median(times):.0f} ms"
        for (kind, shape), times in shape_seconds.items()
    )
    print(f"median step by shape: {steps_line}")
    print(
        f"one epoch (same examples) at those medians: bucketed {epoch_s['bucketed']:.0f} s, "
        f"packed {epoch_s['packed']:.0f} s: "
        f"{epoch_s['bucketed'] / epoch_s['packed']:.2f}x non-pad tokens/s"
    )


if __name__ == "__main__":
    main()
