"""Where a training step spends its time, op by op, in jax (XLA CPU) and in torch eager.

    python -m benchmarks.step_profile [--sizes dec_small] [--dropout 0] [--steps 5]

Each framework runs in its own process on the same model and batch as
`benchmarks.torch_baseline`. Ours: `jax.profiler` traces a few steps of the compiled step
and every executed HLO op (fusion, dot, copy) is put in a class from its name and the
compiled HLO. Torch: `torch.profiler` over the same number of steps, by each aten op's own
(self) time. Classes: matmul (the dot kernels), copy/transpose (layout changes XLA inserts,
torch's copy_/clone/contiguous), softmax/exp, scatter/gather (embedding lookup and its
gradient), other (elementwise fusions, norms, Adam). Times are per step and the shares are
of the op time the profiler saw; compare shares and the per-class ratio, not one run's
milliseconds with another's.
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import re
import subprocess
import sys
import tempfile

from benchmarks.common import SIZES, machine_line

CLASSES = ("matmul", "copy/transpose", "softmax/exp", "scatter/gather", "other")
# XLA runtime bookkeeping and Python frames in the trace: not ops.
_NOT_OPS = (
    "ThunkExecutor",
    "$",
    "SlinkyThreadPool",
    "PjitFunction",
    "CommonPjRt",
    "end: ",
    "np.asarray",  # the host waiting for a result (float(loss)), not an op
)
_NOT_OPS_EXACT = ("ParseArguments", "Handle inputs")


def _xla_class(name: str) -> str:
    if name.startswith(("ynn_fusion", "dot", "onednn", "xnn_fusion")) or "convolution" in name:
        return "matmul"
    if name.startswith("copy") or "transpose" in name:
        return "copy/transpose"
    if "exponential" in name or "reduce" in name:
        return "softmax/exp"
    if "scatter" in name or "gather" in name:
        return "scatter/gather"
    return "other"


def _torch_class(name: str) -> str:
    if name in ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_addmm_activation"):
        return "matmul"
    if name in ("aten::copy_", "aten::clone", "aten::contiguous", "aten::_to_copy"):
        return "copy/transpose"
    if "softmax" in name or name in ("aten::exp", "aten::logsumexp"):
        return "softmax/exp"
    if "embedding" in name or "index" in name or "scatter" in name or "gather" in name:
        return "scatter/gather"
    return "other"


def profile_jax(size_name: str, dropout: float, steps: int) -> dict:
    import jax

    from benchmarks.train_throughput import build_step

    step, params, opt_state = build_step(SIZES[size_name], dropout=dropout)
    rng = jax.random.key(1)
    compiled = step.lower(params, opt_state, rng).compile()
    state = [params, opt_state]

    def run():
        state[0], state[1], loss = compiled(state[0], state[1], rng)
        loss.block_until_ready()

    return _summary(jax_ops(run, steps), _xla_class, steps)


def jax_ops(run, steps: int) -> collections.Counter:
    """Microseconds per executed XLA op over `steps` calls of `run` (after 3 untimed)."""
    import jax

    for _ in range(3):
        run()
    with tempfile.TemporaryDirectory() as folder:
        with jax.profiler.trace(folder, create_perfetto_trace=True):
            for _ in range(steps):
                run()
        # The perfetto trace (the folder also holds the xplane protobuf).
        path = sorted(glob.glob(folder + "/**/perfetto_trace.json.gz", recursive=True))[0]
        trace = json.load(gzip.open(path))
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    by_op = collections.Counter()
    for event in events:
        name = event.get("name", "")
        if event.get("ph") != "X" or "dur" not in event:
            continue
        if name.startswith(_NOT_OPS) or name in _NOT_OPS_EXACT:
            continue
        by_op[name] += event["dur"]
    return by_op


def torch_ops(run, steps: int) -> collections.Counter:
    """Microseconds of self CPU time per torch op over `steps` calls of `run` (after 3
    untimed)."""
    import torch

    for _ in range(3):
        run()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            run()
    by_op = collections.Counter()
    for row in prof.key_averages():
        by_op[row.key] += row.self_cpu_time_total
    return by_op


def profile_torch(size_name: str, dropout: float, steps: int) -> dict:
    from benchmarks.torch_baseline import torch_step

    run = torch_step(SIZES[size_name], dropout)
    return _summary(torch_ops(run, steps), _torch_class, steps)


def _summary(by_op: collections.Counter, classify, steps: int) -> dict:
    per_class = collections.Counter()
    for name, micros in by_op.items():
        per_class[classify(re.sub(r"\.\d+$", "", name))] += micros
    top = [(name, micros / steps / 1e3) for name, micros in by_op.most_common(8)]
    return {
        "ms": {c: per_class[c] / steps / 1e3 for c in CLASSES},
        "top": top,
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="dec_small")
    parser.add_argument("--dropout", type=float, default=0.0)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--worker", choices=("jax", "torch"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        profile = profile_jax if args.worker == "jax" else profile_torch
        print(json.dumps(profile(args.sizes, args.dropout, args.steps)))
        return
    print(machine_line())
    for size_name in args.sizes.split(","):
        results = {}
        for framework in ("jax", "torch"):
            cmd = [sys.executable, "-m", "benchmarks.step_profile", "--worker", framework]
            cmd += ["--sizes", size_name, "--dropout", str(args.dropout)]
            cmd += ["--steps", str(args.steps)]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode != 0:
                tail = done.stderr.strip().splitlines()[-1:] or ["(no output)"]
                print(f"{framework} worker failed: {tail[0]}")
                continue
            results[framework] = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"\n{size_name}, dropout {args.dropout}: op time per step (share of op time)")
        totals = {f: sum(r["ms"].values()) for f, r in results.items()}
        print(f"{'class':16s}" + "".join(f"{f:>22s}" for f in results) + "   jax/torch")
        for c in CLASSES:
            cells = "".join(
                f"{r['ms'][c]:12.1f} ms ({100 * r['ms'][c] / totals[f]:4.1f}%)"
                for f, r in results.items()
            )
            ratio = ""
            if len(results) == 2 and results["torch"]["ms"][c] > 0:
                ratio = f"{results['jax']['ms'][c] / results['torch']['ms'][c]:10.2f}"
            print(f"{c:16s}{cells}{ratio}")
        print(f"{'total':16s}" + "".join(f"{totals[f]:12.1f} ms {'':8s}" for f in results))
        for framework, r in results.items():
            print(
                f"largest {framework} ops: " + ", ".join(f"{n} {ms:.1f} ms" for n, ms in r["top"])
            )


if __name__ == "__main__":
    main()
