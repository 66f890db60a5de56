"""Training throughput (forward + backward + Adam) of our models on this machine.

    python benchmarks/train_throughput.py [--sizes encdec,dec_small,dec_base] [--steps 10]
        [--dtype float32|bfloat16] [--attention xla|jax_nn] [--batch N] [--peak-tflops F]
        [--depth-sweep]

Prints one row per size: median step time, tokens/s, compile time, XLA's memory estimate,
model FLOPs utilisation (the standard 6N + attention count, `model_flops_per_step`, over the
peak of one large matmul measured in the same process) and XLA's own FLOP count over that
peak. `--depth-sweep` also prints the compile time of a 2/6/12/24-layer decoder with and
without `nn.scan`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

import jax
import jax.numpy as jnp
import optax
from flax import linen as nn

from benchmarks.common import (
    SIZES,
    Size,
    machine_line,
    matmul_peak_flops,
    median,
    model_flops_per_step,
    random_tokens,
    time_steps,
)
from flax_transformer import DecoderOnlyTransformer, Transformer, TransformerConfig


def build_step(
    size: Size,
    dtype: str = "float32",
    attention: str = "xla",
    scan_layers: bool = False,
    layers: int | None = None,
    dropout: float = 0.1,
):
    """Model, batch and a jitted (donating) train step for one size."""
    cfg = TransformerConfig(
        vocab_size=size.vocab,
        d_model=size.d_model,
        num_heads=size.heads,
        d_ff=size.d_ff,
        num_layers=layers or size.layers,
        max_len=max(size.src_len, size.tgt_len),
        dropout_rate=dropout,
        # cuDNN's kernel has no dropout on the weights (jax_nn would fall back to ours).
        attention_dropout_rate=0.0 if attention in ("cudnn", "jax_nn") else dropout,
        dtype=dtype,
        attention_impl=attention,
        scan_layers=scan_layers,
    )
    if size.kind == "encdec":
        model = Transformer(cfg)
        inputs = (
            random_tokens((size.batch, size.src_len), size.vocab, 1),
            random_tokens((size.batch, size.tgt_len), size.vocab, 2),
        )
    else:
        model = DecoderOnlyTransformer(cfg)
        inputs = (random_tokens((size.batch, size.tgt_len), size.vocab, 2),)
    labels = random_tokens((size.batch, size.tgt_len), size.vocab, 3)
    params = nn.unbox(model.init(jax.random.key(0), *inputs))
    tx = optax.adam(1e-4)
    opt_state = tx.init(params)

    def loss_fn(p, rng):
        logits = model.apply(p, *inputs, deterministic=False, rngs={"dropout": rng})
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    def step(p, o, rng):
        loss, grads = jax.value_and_grad(loss_fn)(p, rng)
        updates, o = tx.update(grads, o, p)
        return optax.apply_updates(p, updates), o, loss

    return jax.jit(step, donate_argnums=(0, 1)), params, opt_state


def measure(size: Size, steps: int, dtype: str, attention: str, peak: float) -> dict:
    step, params, opt_state = build_step(size, dtype, attention)
    rng = jax.random.key(1)
    start = time.perf_counter()
    compiled = step.lower(params, opt_state, rng).compile()
    compile_s = time.perf_counter() - start
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    flops = float(cost.get("flops", 0.0)) if cost else 0.0
    mem = compiled.memory_analysis()
    mem_mb = (
        (mem.temp_size_in_bytes + mem.argument_size_in_bytes + mem.output_size_in_bytes) / 2**20
        if mem is not None
        else float("nan")
    )
    state = {"p": params, "o": opt_state}

    def run():
        state["p"], state["o"], loss = compiled(state["p"], state["o"], rng)
        loss.block_until_ready()

    t = median(time_steps(run, steps))
    stats = jax.devices()[0].memory_stats() or {}
    return {
        "size": size.name,
        "step_ms": 1e3 * t,
        "tokens_per_s": size.tokens_per_step / t,
        "compile_s": compile_s,
        "mem_mb": mem_mb,
        "peak_bytes_in_use": stats.get("peak_bytes_in_use"),
        "xla_frac": flops / t / peak,
        "mfu": model_flops_per_step(size) / t / peak,
    }


def compile_time(size: Size, layers: int, scan: bool) -> float:
    step, params, opt_state = build_step(size, scan_layers=scan, layers=layers)
    start = time.perf_counter()
    step.lower(params, opt_state, jax.random.key(1)).compile()
    return time.perf_counter() - start


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="encdec,dec_small,dec_base")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--attention", default="xla", choices=["xla", "jax_nn", "cudnn"])
    parser.add_argument("--json", default="", help="also write the results to this JSON file")
    parser.add_argument("--batch", type=int, default=0, help="override every size's batch")
    parser.add_argument(
        "--peak-tflops",
        type=float,
        default=0.0,
        help="peak to divide by; default: a matmul measured here in --dtype",
    )
    parser.add_argument("--depth-sweep", action="store_true")
    args = parser.parse_args(argv)
    names = [s for s in args.sizes.split(",") if s]
    unknown = [s for s in names if s not in SIZES]
    if unknown:
        parser.error(f"unknown size(s) {unknown}; choose from {sorted(SIZES)}")

    print(f"# machine: {machine_line()}")
    if args.peak_tflops:
        peak = args.peak_tflops * 1e12
        print(f"# peak given: {args.peak_tflops} TFLOP/s")
    else:
        on_gpu = jax.devices()[0].platform == "gpu"
        peak = matmul_peak_flops(n=8192 if on_gpu else 1024, dtype=jnp.dtype(args.dtype))
        print(f"# measured {args.dtype} matmul peak: {peak / 1e9:.1f} GFLOP/s")
    print(f"# dtype={args.dtype} attention={args.attention} steps={args.steps}")
    print(
        f"{'size':<10} {'step ms':>9} {'tokens/s':>10} {'compile s':>10} {'XLA MB':>8} "
        f"{'MFU':>7} {'XLA/peak':>9}"
    )
    results = []
    for name in names:
        size = SIZES[name]
        if args.batch:
            size = dataclasses.replace(size, batch=args.batch)
        r = measure(size, args.steps, args.dtype, args.attention, peak)
        results.append(r)
        print(
            f"{r['size']:<10} {r['step_ms']:9.1f} {r['tokens_per_s']:10.0f} "
            f"{r['compile_s']:10.2f} {r['mem_mb']:8.0f} {r['mfu']:7.1%} {r['xla_frac']:9.1%}",
            flush=True,
        )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as file:
            json.dump(results, file, indent=2)
    if args.depth_sweep:
        print("\n# compile time (s) of the dec_small train step against depth")
        print(f"{'layers':>6} {'unrolled':>9} {'nn.scan':>8}")
        for layers in (2, 6, 12, 24):
            unrolled = compile_time(SIZES["dec_small"], layers, False)
            scanned = compile_time(SIZES["dec_small"], layers, True)
            print(f"{layers:>6} {unrolled:9.2f} {scanned:8.2f}", flush=True)


if __name__ == "__main__":
    main()
