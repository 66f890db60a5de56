"""Host memory and time of loading a pretrained source (`--config.init_from`): peak RSS of
`train.program.weights.load_weights` against the checkpoint's size on disk.

    python -m benchmarks.pretrained_load                     # Llama-1B-sized, bf16 on disk
    python -m benchmarks.pretrained_load --layers 4          # a quicker, smaller one
    python -m benchmarks.pretrained_load --dir smollm2       # any source: a GGUF file too

Writes a Llama-family directory of random bfloat16 weights (the shapes of a 1B model:
width 2048, 16 layers, 32 heads, 8 K/V heads, feed-forward 8192, vocabulary 32,000; no
`transformers` needed), then loads it in a fresh process per parameter dtype, each alone,
and prints the peak resident memory above the process's size before the load. The
parameters themselves take 1x (bfloat16) or 2x (float32) the size on disk; the rest is
the loader's own.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import platform
import subprocess
import sys
import tempfile

import numpy as np


def write_llama_dir(path: pathlib.Path, *, width, layers, heads, kv_heads, ffn, vocab) -> int:
    """A Llama directory of random bfloat16 weights; returns its weights' bytes."""
    import ml_dtypes
    from safetensors.numpy import save_file

    rng = np.random.default_rng(0)
    head = width // heads

    def weight(*shape):
        return (rng.standard_normal(shape, np.float32) * 0.02).astype(ml_dtypes.bfloat16)

    tensors = {
        "model.embed_tokens.weight": weight(vocab, width),
        "model.norm.weight": np.ones((width,), ml_dtypes.bfloat16),
        "lm_head.weight": weight(vocab, width),
    }
    for i in range(layers):
        p = f"model.layers.{i}."
        tensors |= {
            p + "input_layernorm.weight": np.ones((width,), ml_dtypes.bfloat16),
            p + "post_attention_layernorm.weight": np.ones((width,), ml_dtypes.bfloat16),
            p + "self_attn.q_proj.weight": weight(heads * head, width),
            p + "self_attn.k_proj.weight": weight(kv_heads * head, width),
            p + "self_attn.v_proj.weight": weight(kv_heads * head, width),
            p + "self_attn.o_proj.weight": weight(width, heads * head),
            p + "mlp.gate_proj.weight": weight(ffn, width),
            p + "mlp.up_proj.weight": weight(ffn, width),
            p + "mlp.down_proj.weight": weight(width, ffn),
        }
    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    config = {
        "model_type": "llama",
        "vocab_size": vocab,
        "hidden_size": width,
        "intermediate_size": ffn,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }
    (path / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return (path / "model.safetensors").stat().st_size


_CHILD = """
import dataclasses, resource, sys, time
import jax
from train.formats import sources
from train.program import weights
def rss_mib():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmRSS")) / 1024
started = time.perf_counter()
source = sources.read_source(sys.argv[1])
read = time.perf_counter() - started
model = dataclasses.replace(source.model, param_dtype=sys.argv[2], scan_layers=sys.argv[3] == "1")
base = rss_mib()
started = time.perf_counter()
params, size = weights.load_weights(source, model)
jax.block_until_ready(params)
load = time.perf_counter() - started
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
n = sum(x.size for x in jax.tree.leaves(params))
print(f"{read:.2f} {load:.2f} {base:.0f} {peak:.0f} {rss_mib():.0f} {n} {size}")
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument(
        "--dir", default="", help="an existing source to load instead (a directory, a .gguf file)"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = pathlib.Path(args.dir or tmp)
        if not args.dir:
            print(f"writing a Llama-1B-shaped directory ({args.layers} layers) ...", flush=True)
            write_llama_dir(
                path, width=2048, layers=args.layers, heads=32, kv_heads=8, ffn=8192, vocab=32000
            )
        print(f"machine: {platform.processor() or platform.machine()}, {platform.node()}")
        print(
            "| param dtype | scan_layers | params | on disk | read (config, tokenizer) | load "
            "| RSS before | peak RSS | (peak - before) / on disk |"
        )
        print("|---|---|---|---|---|---|---|---|---|")
        for dtype in ("bfloat16", "float32"):
            for scan in ("0", "1"):
                out = subprocess.run(
                    [sys.executable, "-c", _CHILD, str(path), dtype, scan],
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout.split()
                read, load, base, peak, _, n, size = (float(x) for x in out[-7:])
                print(
                    f"| {dtype} | {scan == '1'} | {int(n):,} | {size / 2**20:,.0f} MiB | "
                    f"{read:.1f} s | {load:.1f} s | {base:,.0f} MiB | {peak:,.0f} MiB | "
                    f"{(peak - base) / (size / 2**20):.2f}x |"
                )


if __name__ == "__main__":
    main()
