"""Cached decoding speed, ours against the Flax lm1b example in the same run.

    python -m benchmarks.generation --flax-examples /path/to/flax/examples --bandwidth
    FLAX_EXAMPLES=/path/to/flax/examples python -m benchmarks.generation

The first line is the run of benchmarks/RESULTS.md; defaults take about two minutes on a
2-core CPU. Run it on an idle machine: the load average is printed before and after.
`--flax-examples` (or $FLAX_EXAMPLES) names a checkout of github.com/google/flax's
`examples/` directory; its `lm1b/models.py` and `lm1b/temperature_sampler.py` are imported
from there (`benchmarks.lm1b_reference`), never copied. Without it the lm1b column is
skipped, with a message.

The model: decoder-only, vocab 8000, d_model 256, 4 heads, d_ff 1024, 4 layers, max_len 256,
float32, random weights; prompt 16 tokens, 128 new tokens, greedy, no EOS (every run makes
all 128), batch 1 and 8. Implementations, each in its own worker process (two JAX thread
pools in one process slow each other down):

  ours        `generate_text`, float32
  ours_bf16   `generate_text(..., decode_dtype='bfloat16')`: weights and cache in bfloat16
  lm1b        the example's `TransformerLM(decode=True)` in its sampling loop, greedy
  ours_nocache  `generate_text(..., use_cache=False)`, the full model every step (not in
              the default set: `--impls ours,ours_nocache` gives the cache's speed-up)

Each worker compiles first (compile time is excluded); then, round after round, the parent
asks each worker in turn to time `--runs` whole generations at each batch size, so all see
the same machine load while one computes. Reported: tokens/s = B * 128 / (median over
rounds of each round's median run), and the ratios ours / lm1b. `--bandwidth` adds the
memory-bandwidth fraction of batch-1 decoding (`benchmarks.memory_bandwidth`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import common
from benchmarks.common import machine_line, median
from benchmarks.lm1b_reference import EXAMPLES_ENV, find_examples, load_lm1b
from flax_transformer import DecoderOnlyTransformer, generate_text

# The decoding model and lengths, shared with benchmarks.memory_bandwidth (in common).
PROMPT_LEN, NEW_TOKENS = common.DECODE_PROMPT_LEN, common.DECODE_NEW_TOKENS
SIZE, CONFIG = common.DECODE_SIZE, common.DECODE_CONFIG
BATCHES = (1, 8)
IMPLS = ("ours", "ours_bf16", "lm1b", "ours_nocache")
DEFAULT_IMPLS = "ours,ours_bf16,lm1b"


def _load() -> str:
    """The 1, 5 and 15 minute load averages (other work on the cores skews the timings)."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def prompts(batch: int) -> np.ndarray:
    """int32 `(B, P)` random prompt ids in [1, V) (0 is padding in both models)."""
    return np.random.default_rng(batch).integers(1, SIZE["vocab"], (batch, PROMPT_LEN), np.int32)


def ours_runner(batch: int, decode_dtype: str | None, use_cache: bool = True):
    """A function that runs one whole generation at `batch` and blocks until it is done."""
    model = DecoderOnlyTransformer(CONFIG)
    params = model.init(jax.random.key(0), jnp.ones((1, PROMPT_LEN), jnp.int32))
    prompt = jnp.asarray(prompts(batch))
    lengths = jnp.full((batch,), PROMPT_LEN, jnp.int32)

    def run():
        out = generate_text(
            model,
            params,
            prompt,
            lengths,
            eos_id=None,
            max_new_tokens=NEW_TOKENS,
            decode_dtype=decode_dtype,
            use_cache=use_cache,
        )
        return jax.block_until_ready(out)

    return run


def lm1b_runners(examples: str) -> dict:
    """`{batch: run}` for the lm1b example; its sequences hold the prompt, then zeros."""
    params, greedy, _ = load_lm1b(find_examples(examples), SIZE)
    runners = {}
    for batch in BATCHES:
        seqs = np.zeros((batch, PROMPT_LEN + NEW_TOKENS), np.int32)
        seqs[:, :PROMPT_LEN] = prompts(batch)
        seqs = jnp.asarray(seqs)
        runners[batch] = lambda s=seqs: jax.block_until_ready(greedy(params, s))
    return runners


def worker(impl: str, examples: str | None) -> None:
    """One implementation, driven over stdin/stdout by `main`.

    Compiles every batch size, prints one JSON line with the compile seconds, then for each
    `time B K` line times K generations at batch B and prints their seconds as a JSON list.
    """
    if impl == "lm1b":
        runners = lm1b_runners(examples)
    else:
        dtype = "bfloat16" if impl == "ours_bf16" else None
        runners = {b: ours_runner(b, dtype, impl != "ours_nocache") for b in BATCHES}
    compile_s = {}
    for batch, run in runners.items():
        start = time.perf_counter()
        run()
        compile_s[batch] = time.perf_counter() - start
        run()  # first-touch allocations
    print(json.dumps({"ready": impl, "compile_s": compile_s}), flush=True)
    for line in sys.stdin:
        _, batch, runs = line.split()
        times = []
        for _ in range(int(runs)):
            start = time.perf_counter()
            runners[int(batch)]()
            times.append(time.perf_counter() - start)
        print(json.dumps(times), flush=True)


class _Worker:
    """A worker process of this module for one implementation."""

    def __init__(self, impl: str, examples: str | None):
        cmd = [sys.executable, "-m", "benchmarks.generation", "--worker", impl]
        if examples:
            cmd += ["--flax-examples", examples]
        self.process = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self.compile_s = json.loads(self._read())["compile_s"]

    def _read(self) -> str:
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"benchmark worker exited with {self.process.wait()}")
        return line

    def time(self, batch: int, runs: int) -> list[float]:
        self.process.stdin.write(f"time {batch} {runs}\n")
        self.process.stdin.flush()
        return json.loads(self._read())

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait()


def measure(impls: list[str], examples: str | None, rounds: int, runs: int) -> dict:
    """`{impl: {batch: tokens/s}}` from alternating rounds over one worker per impl."""
    workers = {}
    try:
        for impl in impls:
            workers[impl] = _Worker(impl, examples)
        round_medians = {(i, b): [] for i in impls for b in BATCHES}
        for _ in range(rounds):
            for batch in BATCHES:
                for impl, w in workers.items():
                    round_medians[impl, batch].append(median(w.time(batch, runs)))
    finally:
        for w in workers.values():
            w.close()
    return {i: {b: b * NEW_TOKENS / median(round_medians[i, b]) for b in BATCHES} for i in impls}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--flax-examples",
        default=None,
        help=f"a checkout of github.com/google/flax's examples/ (default ${EXAMPLES_ENV})",
    )
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds")
    parser.add_argument("--runs", type=int, default=3, help="generations per worker per round")
    parser.add_argument(
        "--impls", default=DEFAULT_IMPLS, help=f"comma-separated, from {','.join(IMPLS)}"
    )
    parser.add_argument("--bandwidth", action="store_true", help="also the bandwidth fraction")
    parser.add_argument("--worker", choices=IMPLS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args.worker, args.flax_examples)
    impls = args.impls.split(",")
    if "lm1b" in impls and find_examples(args.flax_examples) is None:
        print(
            f"# lm1b column skipped: no lm1b/models.py under --flax-examples or ${EXAMPLES_ENV} "
            f"({args.flax_examples or 'unset'}); point it at a checkout of "
            "github.com/google/flax's examples/ directory."
        )
        impls.remove("lm1b")
        if not impls:
            return
    print(f"# machine: {machine_line()}; load average {_load()} at the start")
    print(
        f"# vocab {CONFIG.vocab_size}, d_model {CONFIG.d_model}, {CONFIG.num_heads} heads, "
        f"d_ff {CONFIG.d_ff}, {CONFIG.num_layers} layers, float32 weights; prompt "
        f"{PROMPT_LEN}, {NEW_TOKENS} new tokens, greedy; each implementation in its own "
        f"process, {args.rounds} alternating rounds of {args.runs} runs, compile excluded"
    )
    tok_s = measure(impls, args.flax_examples, args.rounds, args.runs)
    header = f"{'batch':>5} " + " ".join(f"{i + ' tok/s':>15}" for i in impls)
    ratios = [i for i in impls if i != "lm1b"] if "lm1b" in impls else []
    header += " " + " ".join(f"{i + ' / lm1b':>16}" for i in ratios)
    print(header)
    for batch in BATCHES:
        row = f"{batch:>5} " + " ".join(f"{tok_s[i][batch]:>15,.0f}" for i in impls)
        row += " " + " ".join(f"{tok_s[i][batch] / tok_s['lm1b'][batch]:>15.2f}x" for i in ratios)
        print(row, flush=True)
    print(f"# load average {_load()} at the end")
    if args.bandwidth and "ours" in impls:
        from benchmarks.memory_bandwidth import report

        print(report(CONFIG, PROMPT_LEN, NEW_TOKENS, tok_s["ours"][1]))


if __name__ == "__main__":
    main()
