"""Compile the training program for a TPU topology or NVIDIA GPU hosts on a CPU host: does it
fit, what would a step cost, which collectives does it run.

    pip install -r requirements-tpu.txt   # libtpu, the TPU compiler; no TPU needed
    python -m train.compile --config configs/llama_1b.py --topology v5e:16x16
    python -m train.compile --config configs/transformer_base.py --topology v5e:2x4 \\
        --config.mesh_shape='(1,8,1)' --json base.json
    pip install -r requirements-gpu.txt   # the CUDA plugin, XLA's GPU compiler; no GPU needed
    python -m train.compile --config configs/ja_en_gpu.py --topology h100:1x8

A GPU topology is `<kind>:<hosts>x<GPUs per host>` (h100, h200, a100: train/aot/gpu_specs/ holds
the XLA target config of each). It is compiled "deviceless": jax runs on the CPU
(JAX_PLATFORMS=cpu, which this program sets) and the CUDA plugin's XLA compiles for the GPU
the target config describes. What that cannot check is listed in the report (`not_checked`):
cuDNN kernels are not built, nothing is autotuned, and XLA has no cost analysis for GPUs (the
FLOPs are those of the traced step).

The train and eval steps are those `train.main` runs, compiled ahead of time by XLA for the
topology's chips from abstract inputs (`train.aot.compile_lib`): the train state placed by
`--config.mesh_shape` and the logical axis rules, and a batch of the config's shape (its
longest bucket). No data is read and no parameter is initialised.

FLOP figures are per train step over all chips, byte figures per chip. Exit status (as
train.main): 0 when both steps fit the chips' HBM; 1 when one does not (one line: what it
needs, of what, and what to try); 2 for a usage error (a bad flag or config value, an
unknown topology, libtpu or the CUDA plugin not installed). Errors are one line,
`error: <what> ; <fix>`.
"""

from __future__ import annotations

import json
import os
import sys
from typing import TYPE_CHECKING

from absl import app, flags

from train.aot.compile_costs import (
    CHIPS,
    COLLECTIVES,
    GPUS,
    TOPOLOGY_EXAMPLES,
    check_attention_impl,
    chip_of,
)
from train.core.cli import (
    define_config_flag,
    die,
    loaded_config,
    native_stderr_captured,
    parse_config_flags,
    quiet_library_logs,
)
from train.core.failures import RUN_ERROR, USAGE_ERROR

if TYPE_CHECKING:
    from train.aot.compile_lib import TopologyReport

FLAGS = flags.FLAGS
flags.DEFINE_string(
    "topology",
    None,
    "TPU topology to compile for (v5e:2x2, v5e:16x16, v4:2x2x2, v5p:4x4x4, ...) or NVIDIA GPU "
    "hosts as <kind>:<hosts>x<GPUs per host> (h100:1x8, h100:2x8, h200:1x8, a100:1x8)",
)
flags.DEFINE_string("json", None, "Also write the figures to this JSON file.")
flags.DEFINE_string("hlo", None, "Also write the compiled train step's HLO text to this file.")

_GiB = 2**30


def libtpu_installed() -> bool:
    """Whether the `libtpu` package (the TPU compiler) can be imported."""
    try:
        import libtpu  # noqa: F401
    except ImportError:
        return False
    return True


def cuda_plugin_installed() -> bool:
    """Whether jax's CUDA plugin (jax-cuda12-plugin and jax-cuda12-pjrt, XLA's GPU compiler)
    is installed; its package is imported (an empty one: no CUDA library is loaded)."""
    import importlib.util

    try:
        import jax_cuda12_plugin  # noqa: F401

        pjrt = importlib.util.find_spec("jax_plugins.xla_cuda12")
    except ImportError:
        return False
    return pjrt is not None


def _gib(size: float) -> str:
    """GiB, or MiB below 1 GiB."""
    if size < _GiB:
        return f"{size / 2**20:.1f} MiB"
    return f"{size / _GiB:.2f} GiB"


def _advice(report: TopologyReport) -> str:
    """One line: how much the steps need of how much, and what to try."""
    mesh = report.mesh
    need = (
        report.refusal
        or f"a step needs {_gib(report.needed_bytes)} per chip of the "
        f"{_gib(report.chip.hbm_bytes)} {_memory(report.chip)} of a {report.chip.name}"
    )
    return (
        f"{report.topology}: does not fit: {need} ; shard parameters and optimizer state over "
        "more chips "
        f"(--config.mesh_shape, now (data, fsdp, tensor)=({mesh['data']}, {mesh['fsdp']}, "
        f"{mesh['tensor']}): raise fsdp or tensor), set --config.model.remat=True, or lower "
        "--config.batch_size / tokens_per_batch"
    )


def _memory(chip) -> str:
    return "GPU memory" if chip.is_gpu else "HBM"


def _step_lines(report: TopologyReport) -> list[str]:
    chip, train = report.chip, report.train
    xla = "n/a" if train.flops is None else f"{train.flops * report.num_chips:.4g}"
    accessed = "n/a" if train.bytes_accessed is None else f"{train.bytes_accessed:.4g}"
    if train.kernel_bytes:
        accessed += (
            f" + splash kernels' streaming {train.kernel_bytes / report.num_chips:.4g} "
            "(their tiles re-read, counted from shapes: train/aot/traced_costs.py)"
        )
    lines = [
        "train step, bytes per chip: "
        + ", ".join(f"{k} {_gib(v)}" for k, v in train.bytes.items())
        + f" of {_gib(chip.hbm_bytes)} {_memory(chip)}",
        "eval step, bytes per chip: "
        + (f"total {_gib(report.eval.bytes['total'])}" if report.eval else report.refusal),
        f"FLOPs per step (all chips): XLA {xla}; matrix products of the traced step "
        f"{train.traced_flops:.4g} (remat recomputation and attention kernels included); "
        f"model formula {report.model_flops:.4g} (6 per matrix parameter per token; "
        "attention q k^T and weights v counted in full, not halved for causal masks)",
        f"HBM bytes accessed per chip (XLA): {accessed}",
    ]
    if train.loops and train.flops is not None:
        lines.append(
            "  (XLA's cost analysis counts a while loop's body once: with nn.scan over layers "
            "its FLOPs and bytes cover one layer, and the bound below is low; "
            "--config.model.scan_layers=False compiles the same step with every layer counted)"
        )
    bound = (
        f"FLOPs per chip {report.flops_per_chip:.4g} / {chip.peak_flops / 1e12:.0f} TFLOP/s"
        if train.bytes_accessed is None
        else f"max(FLOPs per chip {report.flops_per_chip:.4g} / {chip.peak_flops / 1e12:.0f} "
        f"TFLOP/s, bytes {report.bytes_per_chip:.4g} / {chip.hbm_bandwidth / 1e9:.0f} GB/s)"
    )
    lines += [
        f"step time >= {report.step_time_lower_bound_s * 1e3:.4g} ms = {bound}; MFU ceiling "
        f"{100 * report.mfu_ceiling:.1f}% (model formula FLOPs / peak of the chips over that "
        "time)",
        "collectives per step (bytes: each one's result per chip, loops counted per iteration"
        + ("" if train.collectives_exact else "; a loop's trip count unread: counted once")
        + "):",
    ]
    for kind in COLLECTIVES:
        found = train.collectives[kind]
        lines.append(f"  {kind:<19} {found['count']:>6}  {_gib(found['bytes'])}")
    moved = sum(found["bytes"] for found in train.collectives.values())
    if chip.ici_bandwidth:
        lines.append(
            f"  total {_gib(moved)}: ~{moved / chip.ici_bandwidth * 1e3:.4g} ms at the chip's "
            f"{chip.ici_bandwidth / 1e9:.0f} GB/s {chip.link} (bidirectional) if not overlapped"
            + ("; between hosts the network is slower" if chip.is_gpu else "")
        )
    lines.append(
        f"compile time: train step {train.compile_s:.1f} s"
        + (f", eval step {report.eval.compile_s:.1f} s" if report.eval else "")
    )
    return lines


def format_report(report: TopologyReport) -> str:
    """The figures as lines of text, ending with the chip table and its sources."""
    chip, mesh = report.chip, report.mesh
    lines = [
        f"topology {report.topology}: {report.num_chips} x {chip.name} ({report.device_kind}), "
        f"mesh data={mesh['data']} fsdp={mesh['fsdp']} tensor={mesh['tensor']}",
        f"parameters: {report.params:,}",
    ]
    if report.train:
        lines += _step_lines(report)
    else:
        lines.append(f"train step: {report.refusal}")
    lines.append(f"fits: {'yes' if report.fits else 'NO'}")
    if report.not_checked:
        lines.append("not checked by compiling without the GPU:")
        lines += [f"  - {what}" for what in report.not_checked]
    if chip.is_gpu:
        lines.append("GPU figures (per GPU; NVIDIA's datasheets, dense bf16):")
        known_chips = GPUS.values()
    else:
        lines.append("chip figures (per chip; Google's Cloud TPU pages):")
        known_chips = CHIPS.values()
    lines.append(f"  {'chip':<8} {'bf16 peak':>14} {'memory':>10} {'mem BW':>10}  source")
    for known in known_chips:
        lines.append(
            f"  {known.name:<8} {known.peak_flops / 1e12:>6.0f} TFLOP/s {_gib(known.hbm_bytes):>10}"
            f" {known.hbm_bandwidth / 1e9:>5.0f} GB/s  {known.source}"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        die(f"unexpected arguments {argv[1:]} ; use --flag=value.", USAGE_ERROR)
    if not FLAGS.topology:
        die(f"--topology is required ; name the TPU slice, e.g. one of {TOPOLOGY_EXAMPLES}")
    try:
        chip = chip_of(FLAGS.topology)
    except ValueError as err:
        die(str(err), USAGE_ERROR)
    config = loaded_config(FLAGS.config)
    try:  # a kernel the chips cannot run is the config's mistake, whatever is installed
        check_attention_impl(FLAGS.topology, chip, config.model.get("attention_impl"))
    except ValueError as err:
        die(str(err), USAGE_ERROR)
    if chip.is_gpu:
        if os.environ.get("JAX_PLATFORMS") != "cpu":
            die(
                f"JAX_PLATFORMS={os.environ.get('JAX_PLATFORMS')}: a GPU topology is compiled "
                "without a GPU, with jax on the CPU ; unset JAX_PLATFORMS (train.compile sets "
                "it to cpu) or set JAX_PLATFORMS=cpu",
                USAGE_ERROR,
            )
        if not cuda_plugin_installed():
            die(
                "train.compile needs jax's CUDA plugin for GPU topologies (XLA's GPU compiler; "
                "no GPU needed) ; pip install -r requirements-gpu.txt",
                USAGE_ERROR,
            )
    elif not libtpu_installed():
        die(
            "train.compile needs libtpu (the TPU compiler; no TPU needed) ; "
            "pip install -r requirements-tpu.txt",
            USAGE_ERROR,
        )
    quiet_library_logs()
    with native_stderr_captured():  # jax starts (for a valid command only), and its plugins
        import jax

        from train.aot.compile_lib import compile_for_topology

        jax.devices()

    try:
        report = compile_for_topology(config, FLAGS.topology)
    except ValueError as err:
        die(str(err), USAGE_ERROR)
    print(format_report(report), flush=True)
    outputs = {"json": json.dumps(report.summary(), indent=2) + "\n"}
    if report.train is not None:
        outputs["hlo"] = report.train.hlo
    for flag, text in outputs.items():
        path = getattr(FLAGS, flag)
        if not path:
            continue
        try:
            with open(path, "w", encoding="utf-8") as file:
                file.write(text)
        except OSError as err:
            die(f"--{flag} {path}: {err.strerror or err} ; choose a writable path", RUN_ERROR)
    if not report.fits:
        die(_advice(report), RUN_ERROR)


def run() -> None:
    """Entry point: jax on the CPU (the TPU or GPU is a compile target only), then flags and
    main."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    # libtpu locks /tmp/libtpu_lockfile for the TPU chips of its process, so a second
    # compile at the same time (pytest -n 2) would fail; compile-only devices open no chip.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    define_config_flag(sys.argv)
    app.run(main, flags_parser=parse_config_flags)


if __name__ == "__main__":
    run()
