"""The matmuls of one training step, alone, in jax and in torch (one process each).

    python -m benchmarks.matmul_shapes                  # dec_small / encdec steps
    python -m benchmarks.matmul_shapes nanogpt_gpu      # nanoGPT's GPU recipe on 8 rows
    python -m benchmarks.matmul_shapes default f32,bf16,bf16_f32   # jax's dtype axis

A minimal reproduction for the training-speed gap to torch eager on a CPU: if XLA runs the
step's own matmul shapes (forward and both gradient forms) slower than torch does, the gap
is in the matmul kernels, not in our model code. The projections are dec_small's; the
attention products are the batched ones of the encdec and dec_small steps (one small
product per sequence and head, B x N of them, where torch calls one bmm). Each framework
runs in its own process (their thread pools would interfere); each shape is timed as the
median of 20 calls after a warm-up, float32.

The dtype axis (jax only; issue 58): `f32` float32; `bf16` bfloat16 operands and a
bfloat16 result; `bf16_f32` bfloat16 operands summed into a float32 result
(`preferred_element_type`, the library's mixed-precision policy). XLA runs the last on a
CPU's bfloat16 matrix units where it has them (AMX); without them both bfloat16 forms are
emulated. Each dtype runs in its own process too.
"""

from __future__ import annotations

import json
import subprocess
import sys

from benchmarks.common import SIZES, machine_line

# (name, G, M, K, N, A transposed, B transposed) of C = A (M, K) @ B (K, N), G of them side
# by side (1: a plain 2-D matmul). T = batch x length tokens of a dec_small step.
# A transposed operand is stored the other way round, as the backward pass has it:
# dW = X^T dY with X stored (T, D); dX = dY W^T with W stored (D, V). The attention products
# are per (sequence, head) of the encdec and dec_small steps: scores Q K^T with K stored
# (S, H), then P V.
_S = SIZES["dec_small"]
_T = _S.batch * _S.tgt_len
_E = SIZES["encdec"]
_EB, _EL, _EH = _E.batch * _E.heads, _E.tgt_len, _E.d_model // _E.heads
_SB, _SL, _SH = _S.batch * _S.heads, _S.tgt_len, _S.d_model // _S.heads
SHAPES = [
    ("qkv fwd", 1, _T, _S.d_model, 3 * _S.d_model, False, False),
    ("ffn in fwd", 1, _T, _S.d_model, _S.d_ff, False, False),
    ("ffn out fwd", 1, _T, _S.d_ff, _S.d_model, False, False),
    ("logits fwd", 1, _T, _S.d_model, _S.vocab, False, False),
    ("logits dX = dY W^T", 1, _T, _S.vocab, _S.d_model, False, True),
    ("logits dW = X^T dY", 1, _S.d_model, _T, _S.vocab, True, False),
    ("ffn in dW = X^T dY", 1, _S.d_model, _T, _S.d_ff, True, False),
    ("encdec attention Q K^T", _EB, _EL, _EH, _EL, False, True),
    ("encdec attention P V", _EB, _EL, _EL, _EH, False, False),
    ("dec_small attention Q K^T", _SB, _SL, _SH, _SL, False, True),
    ("dec_small attention P V", _SB, _SL, _SL, _SH, False, False),
]

# nanoGPT's shakespeare_char GPU recipe (6 x 384, 6 heads, 256 tokens, vocabulary 65) on 8
# rows (benchmarks/nanogpt_peer.py's gpu_b8): its step's products, forward and gradients.
_NT, _ND, _NF, _NV, _NB, _NL, _NH = 8 * 256, 384, 4 * 384, 65, 8 * 6, 256, 64
NANOGPT_GPU = [
    ("qkv fwd", 1, _NT, _ND, 3 * _ND, False, False),
    ("qkv dX = dY W^T", 1, _NT, 3 * _ND, _ND, False, True),
    ("qkv dW = X^T dY", 1, _ND, _NT, 3 * _ND, True, False),
    ("ffn in fwd", 1, _NT, _ND, _NF, False, False),
    ("ffn in dW = X^T dY", 1, _ND, _NT, _NF, True, False),
    ("ffn out fwd", 1, _NT, _NF, _ND, False, False),
    ("ffn out dX = dY W^T", 1, _NT, _ND, _NF, False, True),
    ("logits fwd", 1, _NT, _ND, _NV, False, False),
    ("attention Q K^T", _NB, _NL, _NH, _NL, False, True),
    ("attention P V", _NB, _NL, _NL, _NH, False, False),
    ("attention dP = dO V^T", _NB, _NL, _NH, _NL, False, True),
    ("attention dV = P^T dO", _NB, _NL, _NL, _NH, True, False),
]
SHAPE_SETS = {"default": SHAPES, "nanogpt_gpu": NANOGPT_GPU}


def _operands(g, m, k, n, ta, tb, make):
    """A (M, K) and B (K, N), `g` of each when g > 1, built transposed-in-storage where the
    flag says."""
    lead = (g,) if g > 1 else ()
    a = make((*lead, k, m)) if ta else make((*lead, m, k))
    b = make((*lead, n, k)) if tb else make((*lead, k, n))
    return a, b


_STEPS = 20


# jax's dtype axis: (operand dtype, result dtype) by name.
JAX_DTYPES = {
    "f32": ("float32", "float32"),
    "bf16": ("bfloat16", "bfloat16"),
    "bf16_f32": ("bfloat16", "float32"),
}


def _time_jax(shapes, dtype: str = "f32") -> dict[str, float]:
    import time

    import jax
    import jax.numpy as jnp
    import numpy as np

    operand, result = (jnp.dtype(d) for d in JAX_DTYPES[dtype])
    out = {}
    rng = np.random.default_rng(0)
    for name, g, m, k, n, ta, tb in shapes:
        a, b = _operands(g, m, k, n, ta, tb, lambda s: jnp.asarray(rng.standard_normal(s), operand))
        f = jax.jit(
            lambda x, y, ta=ta, tb=tb: jnp.matmul(
                x.swapaxes(-1, -2) if ta else x,
                y.swapaxes(-1, -2) if tb else y,
                preferred_element_type=result,
            )
        )
        f(a, b).block_until_ready()
        times = []
        for _ in range(_STEPS):
            start = time.perf_counter()
            f(a, b).block_until_ready()
            times.append(time.perf_counter() - start)
        out[name] = float(np.median(times))
    return out


def _time_torch(shapes) -> dict[str, float]:
    import time

    import numpy as np
    import torch

    out = {}
    for name, g, m, k, n, ta, tb in shapes:
        a, b = _operands(g, m, k, n, ta, tb, lambda s: torch.randn(*s))
        # Strided views, as autograd passes them.
        a, b = (a.transpose(-1, -2) if ta else a), (b.transpose(-1, -2) if tb else b)
        a @ b
        times = []
        for _ in range(_STEPS):
            start = time.perf_counter()
            a @ b
            times.append(time.perf_counter() - start)
        out[name] = float(np.median(times))
    return out


def main() -> None:
    args = sys.argv[1:]
    if args and args[0] in ("jax", "torch"):  # a worker: time one framework, print JSON
        shapes = SHAPE_SETS[args[1] if len(args) > 1 else "default"]
        if args[0] == "jax":
            print(json.dumps(_time_jax(shapes, args[2] if len(args) > 2 else "f32")))
        else:
            print(json.dumps(_time_torch(shapes)))
        return
    set_name = args[0] if args else "default"
    if set_name not in SHAPE_SETS:
        sys.exit(f"unknown shape set {set_name!r}; choose one of {sorted(SHAPE_SETS)}")
    dtypes = args[1].split(",") if len(args) > 1 else ["f32"]
    unknown = [d for d in dtypes if d not in JAX_DTYPES]
    if unknown or "f32" not in dtypes:
        sys.exit(f"dtypes {args[1]!r}: choose among {sorted(JAX_DTYPES)}, f32 included")

    def worker(*worker_args):
        run = subprocess.run(
            [sys.executable, "-m", "benchmarks.matmul_shapes", *worker_args],
            capture_output=True,
            text=True,
            check=True,
        )
        return json.loads(run.stdout.strip().splitlines()[-1])

    results = {"jax": worker("jax", set_name, "f32"), "torch": worker("torch", set_name)}
    by_dtype = {d: results["jax"] if d == "f32" else worker("jax", set_name, d) for d in dtypes}
    print(f"# machine: {machine_line()}; float32, median of {_STEPS}; shapes {set_name}")
    head = f"{'matmul ([G x] M x K x N)':<42} {'jax GFLOP/s':>12} {'torch GFLOP/s':>14}"
    print(f"{head} {'jax/torch':>10}")
    totals = {"jax": 0.0, "torch": 0.0}
    for name, g, m, k, n, _, _ in SHAPE_SETS[set_name]:
        flops = 2 * g * m * k * n
        j, t = flops / results["jax"][name] / 1e9, flops / results["torch"][name] / 1e9
        for framework in totals:
            totals[framework] += results[framework][name]
        label = f"{name} ({g}x{m}x{k}x{n})" if g > 1 else f"{name} ({m}x{k}x{n})"
        print(f"{label:<42} {j:12.1f} {t:14.1f} {j / t:10.2f}")
    ratio = totals["torch"] / totals["jax"]
    print(
        f"all shapes once: jax {1e3 * totals['jax']:.1f} ms, torch "
        f"{1e3 * totals['torch']:.1f} ms (jax/torch speed {ratio:.2f})"
    )
    if len(dtypes) > 1:
        _print_dtypes(set_name, dtypes, by_dtype)


def _print_dtypes(set_name: str, dtypes: list[str], by_dtype: dict) -> None:
    """jax's GFLOP/s per shape and dtype, and each dtype's speed against float32."""
    print(f"\n# jax by dtype (operands -> result), GFLOP/s; shapes {set_name}")
    print(f"{'matmul ([G x] M x K x N)':<42} " + " ".join(f"{d:>9}" for d in dtypes))
    totals = dict.fromkeys(dtypes, 0.0)
    for name, g, m, k, n, _, _ in SHAPE_SETS[set_name]:
        flops = 2 * g * m * k * n
        label = f"{name} ({g}x{m}x{k}x{n})" if g > 1 else f"{name} ({m}x{k}x{n})"
        cells = []
        for d in dtypes:
            totals[d] += by_dtype[d][name]
            cells.append(f"{flops / by_dtype[d][name] / 1e9:9.1f}")
        print(f"{label:<42} " + " ".join(cells))
    speed = ", ".join(f"{d} {totals['f32'] / totals[d]:.2f}x" for d in dtypes)
    print(f"all shapes once, speed against f32: {speed}")


if __name__ == "__main__":
    main()
