"""Generation speed with and without the KV cache (issue 4). Not a test: run it by hand.

    python benchmarks/generation.py [--runs 5] [--uncached-runs 3]

A decoder-only model (vocab 8000, d_model 256, 4 heads, d_ff 1024, 4 layers, float32,
random weights), prompt 16 tokens, 128 new tokens (greedy, no EOS so every run makes all
128), batch 1 and 8. Prints tokens/s (generated tokens / wall time of one whole jitted
`generate_text` call, median of several runs, compile excluded), the cache speed-up, and
the compile time (first call minus a steady-state call).

Reference (the Flax LM1B example's cached decode of this model on a 2-core CPU): about 870
tokens/s at batch 1 and 2,240 at batch 8; without a cache about 85 and 100.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from flax_transformer import DecoderOnlyTransformer, TransformerConfig, generate_text

PROMPT_LEN = 16
NEW_TOKENS = 128
BATCHES = (1, 8)
CONFIG = TransformerConfig(
    vocab_size=8000, d_model=256, num_heads=4, d_ff=1024, num_layers=4, max_len=256
)


def _block(x):
    return jax.block_until_ready(x)


def measure(model, params, batch: int, use_cache: bool, runs: int) -> tuple[float, float]:
    """(tokens/s, compile seconds) for one batch size and cache setting."""
    rng = np.random.default_rng(batch)
    prompt = jnp.asarray(rng.integers(1, CONFIG.vocab_size, (batch, PROMPT_LEN)), jnp.int32)
    lengths = jnp.full((batch,), PROMPT_LEN, jnp.int32)

    def run():
        return _block(
            generate_text(
                model,
                params,
                prompt,
                lengths,
                eos_id=None,
                max_new_tokens=NEW_TOKENS,
                use_cache=use_cache,
            )
        )

    start = time.perf_counter()
    out = run()
    first = time.perf_counter() - start
    assert out.shape == (batch, NEW_TOKENS)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    steady = statistics.median(times)
    return batch * NEW_TOKENS / steady, max(first - steady, 0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="timed runs with the cache")
    parser.add_argument("--uncached-runs", type=int, default=3, help="timed runs without it")
    args = parser.parse_args()

    model = DecoderOnlyTransformer(CONFIG)
    params = model.init(jax.random.key(0), jnp.ones((1, PROMPT_LEN), jnp.int32))
    print(
        f"jax {jax.__version__} on {jax.devices()[0].platform}, {os.cpu_count()} CPU cores; "
        f"vocab {CONFIG.vocab_size}, d_model {CONFIG.d_model}, {CONFIG.num_heads} heads, "
        f"d_ff {CONFIG.d_ff}, {CONFIG.num_layers} layers; prompt {PROMPT_LEN}, "
        f"{NEW_TOKENS} new tokens; median of {args.runs} (cache) / {args.uncached_runs} runs"
    )
    header = f"{'batch':>5} | {'cache tok/s':>11} | {'no-cache tok/s':>14} | {'speed-up':>8} |"
    header += f" {'compile cache':>13} | {'compile no-cache':>16}"
    print(header)
    print("-" * len(header))
    for batch in BATCHES:
        cached, compile_cached = measure(model, params, batch, True, args.runs)
        plain, compile_plain = measure(model, params, batch, False, args.uncached_runs)
        print(
            f"{batch:>5} | {cached:>11,.0f} | {plain:>14,.1f} | {cached / plain:>7.1f}x |"
            f" {compile_cached:>12.2f}s | {compile_plain:>15.2f}s",
            flush=True,
        )
    print("reference (Flax LM1B, 2-core CPU): cache 870 / 2,240 tok/s, no cache 85 / 100")


if __name__ == "__main__":
    main()
