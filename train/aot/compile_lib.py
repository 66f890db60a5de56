"""Ahead-of-time compilation of the training program for a TPU or NVIDIA GPU topology, on any
host: `compile_for_topology(config, 'v5e:16x16')`, `compile_for_topology(config, 'h100:1x8')`
(what `python -m train.compile` prints).

The train and eval steps are those `train.main` runs (`train_lib.build_program`), compiled
by XLA for the topology's chips (libtpu's compile-only devices, or the CUDA plugin's
deviceless ones for a GPU target config of train/aot/gpu_specs/) from abstract inputs: the
train state's shapes and placement by `config.mesh_shape` and the logical axis rules, and a
batch of the config's shape, built by the task's own batcher from one synthetic example of
`max_len` tokens (the longest bucket). No data is read and no parameter is initialised.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import pathlib
import re
import sys
import threading
import time

import jax
from jax.experimental import topologies

from flax_transformer import sharding as sharding_lib
from train import tasks
from train.aot import compile_costs, traced_costs
from train.aot.compile_costs import TOPOLOGY_EXAMPLES, Chip, chip_of
from train.config import config_lib
from train.core import compute_dtype
from train.core.cli import native_stderr_captured
from train.data.packing import get_packer
from train.data.tokenizer import UNK_ID, model_vocab_size
from train.program import loop as train_lib


@contextlib.contextmanager
def stage(what: str):
    """Shows `what ...` on stderr while it runs (the seconds tick on a terminal), then its time."""
    start, done = time.perf_counter(), threading.Event()
    tty = sys.stderr.isatty()

    def tick():
        while not done.wait(1.0):
            elapsed = time.perf_counter() - start
            print(f"\r{what} ... {elapsed:.0f} s", end="", file=sys.stderr, flush=True)

    print(f"{what} ...", end="" if tty else "\n", file=sys.stderr, flush=True)
    ticker = threading.Thread(target=tick, daemon=True)
    if tty:
        ticker.start()
    try:
        yield
    finally:
        done.set()
        if tty:
            ticker.join()
        elapsed = time.perf_counter() - start
        print(f"{chr(13) if tty else ''}{what}: {elapsed:.1f} s", file=sys.stderr, flush=True)


# The XLA GPU target configs (GpuTargetConfigProto text) of `compile_costs.GPUS`.
GPU_SPECS = pathlib.Path(__file__).resolve().parent / "gpu_specs"

# jax asks the cuDNN library for its version when it lowers cuDNN attention, only to refuse
# features an older cuDNN lacks. Compiling without a GPU needs no cuDNN library, so where
# none is installed the oldest version jax 0.10's CUDA plugin accepts is assumed (its wheel
# requires nvidia-cudnn-cu12>=9.8; jax encodes 9.8.0 as 90800).
ASSUMED_CUDNN_VERSION = 90800


@contextlib.contextmanager
def _cudnn_version_assumed():
    """jax's cuDNN version check answers `ASSUMED_CUDNN_VERSION` inside the block when no
    cuDNN library can be loaded (jax's private `check_cudnn_version`; a jax without it is
    left alone)."""
    try:
        from jax._src.cudnn import fused_attention_stablehlo as cudnn_attention

        cudnn_attention.check_cudnn_version()
        found = True
    except (ImportError, AttributeError):
        found = True  # another jax: nothing to patch
    except RuntimeError:  # 'cuDNN not found.'
        found = False
    if found:
        yield
        return
    saved = cudnn_attention.check_cudnn_version
    cudnn_attention.check_cudnn_version = lambda: ASSUMED_CUDNN_VERSION
    try:
        yield
    finally:
        cudnn_attention.check_cudnn_version = saved


def topology_devices(topology: str, chip: Chip) -> list:
    """The compile-only devices of a topology, one per chip: libtpu's for a TPU slice, the
    CUDA plugin's deviceless ones (the GPU of `chip.target_config`) for GPU hosts.

    Raises:
        ValueError: libtpu or the CUDA plugin rejects the shape (e.g. v5e:3x3), naming its
            reason.
    """
    compiler = "the CUDA plugin" if chip.is_gpu else "libtpu"
    try:
        with native_stderr_captured():
            if chip.is_gpu:
                found = topologies.get_topology_desc(
                    platform="cuda",
                    target_config=(GPU_SPECS / chip.target_config).read_text(),
                    topology=compile_costs.gpu_topology(topology),
                )
            else:
                found = topologies.get_topology_desc(
                    platform="tpu", topology_name=topology, chip_config_name=chip.chip_config
                )
    except Exception as err:  # jax raises its runtime error type for a bad shape
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ValueError(
            f"--topology={topology}: {compiler} cannot build it ({reason}) ; "
            f"use a shape the generation has, e.g. {TOPOLOGY_EXAMPLES}"
        ) from None
    return list(found.devices)


def abstract_batch(data, task, mesh, *, evaluation: bool) -> dict:
    """The step's batch as ShapeDtypeStructs placed on the mesh: the task's batcher applied to
    one synthetic example of `max_len` tokens (its longest bucket). `data` is the run's data
    section (`train.config.sections.DataConfig`).

    Raises:
        ValueError: its rows do not split over the mesh's data x fsdp devices.
    """
    example = task.to_sides(task.synthetic_example(data.max_len))
    packer = get_packer(data.packing)
    (batch, *_) = packer.batches(
        data, task.sides, [example], None, mesh.size, evaluation=evaluation
    )
    rows = next(iter(batch.values())).shape[0]
    split = mesh.shape["data"] * mesh.shape["fsdp"]
    if rows % split:
        raise ValueError(
            f"--config.batch_size / tokens_per_batch: a batch of {rows} rows does not split "
            f"over data x fsdp = {split} devices of --config.mesh_shape="
            f"{tuple(mesh.devices.shape)} ; make the rows a multiple of {split}"
        )
    sharding = sharding_lib.batch_sharding(mesh)
    return {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=sharding) for k, v in batch.items()}


@dataclasses.dataclass(frozen=True)
class StepCost:
    """What XLA says of one compiled step, per chip.

    Attributes:
        bytes: arguments, outputs, temp, code and total (arguments + outputs - donated
            buffers counted twice + temp + code).
        flops: FLOPs of one execution as XLA's cost analysis counts them (a while loop's body,
            e.g. the layers of `scan_layers=True`, counted once); None where XLA has no cost
            analysis for the backend (GPU executables: UNIMPLEMENTED in jax 0.10).
        traced_flops: FLOPs of the matrix products of the traced step over all chips, every
            loop iteration and `remat` recomputation included, those inside cuDNN and splash
            attention kernels too (`traced_costs.traced_costs`).
        bytes_accessed: HBM bytes read and written, counted as the FLOPs are (None as they);
            a Pallas kernel's operands and results count once at most.
        kernel_bytes: HBM bytes the splash kernels move beyond their operands and results
            once, over all chips (`traced_costs.splash_costs`; 0 without splash).
        collectives: {kind: {count, bytes}} (`compile_costs.collectives`).
        collectives_exact: False when a loop's trip count could not be read.
        loops: whether the program has while loops.
        compile_s: seconds to trace, lower and compile.
        hlo: the compiled program's HLO text.
    """

    bytes: dict[str, int]
    flops: float | None
    traced_flops: int
    bytes_accessed: float | None
    kernel_bytes: int
    collectives: dict[str, dict[str, int]]
    collectives_exact: bool
    loops: bool
    compile_s: float
    hlo: str = dataclasses.field(repr=False, default="")


class OutOfMemory(Exception):
    """XLA refused to compile a step: its buffers exceed what it can use of the chip's HBM."""


# Words of jax's errors about placing arrays on the mesh ("Sharding spec ... does not evenly
# divide the dimension size 6"): those, and only those, are the mesh shape's fault.
_PLACEMENT = re.compile(r"shard|divide|partition", re.IGNORECASE)


def _trace_error(message: str) -> str:
    """One line naming the field behind an error of tracing or lowering a step: the mesh
    for jax's placement errors, the attention kernel for the library's kernel errors
    (which say what to change), and otherwise the error as it is."""
    line = message.splitlines()[0] if message else "unknown error"
    if "attention_impl=" in line:  # MultiHeadAttention's kernel checks
        return f"--config.model.attention_impl: {line}"
    if _PLACEMENT.search(line):
        return (
            f"--config.mesh_shape: the step cannot be placed on this mesh ({line}) ; choose "
            "axis sizes that divide the model's dimensions and the batch"
        )
    return line


def _compile(jitted, *args) -> StepCost:
    """Lowers and compiles a jitted step for the arguments' (abstract) shapes and placement.

    Raises:
        OutOfMemory: XLA's message (e.g. 'Ran out of memory on HBM, ... (22.5G) exceeds
            available HBM (15.75G).').
        ValueError: the arguments cannot be placed on the mesh (jax's reason).
    """
    start = time.perf_counter()
    try:
        traced = jitted.trace(*args)
        lowered = traced.lower()
    except ValueError as err:
        raise ValueError(_trace_error(str(err))) from None
    try:
        compiled = lowered.compile()
    except Exception as err:  # jax's runtime error type; only an out-of-memory is expected
        message = str(err).strip()
        if not message.startswith("RESOURCE_EXHAUSTED"):
            raise
        raise OutOfMemory(message.split(":", 1)[1].strip().splitlines()[0]) from None
    seconds = time.perf_counter() - start
    memory = compiled.memory_analysis()
    sizes = {
        "arguments": memory.argument_size_in_bytes,
        "outputs": memory.output_size_in_bytes,
        "temp": memory.temp_size_in_bytes,
        "code": memory.generated_code_size_in_bytes,
    }
    sizes["total"] = sum(sizes.values()) - memory.alias_size_in_bytes
    try:
        cost = compiled.cost_analysis()
    except Exception:  # jax's runtime error type: UNIMPLEMENTED for some backends
        cost = None
    cost = cost[0] if isinstance(cost, list | tuple) else cost  # older jax: one per device
    hlo = compiled.as_text()
    found, exact = compile_costs.collectives(hlo)
    counted = traced_costs.traced_costs(traced.jaxpr)
    return StepCost(
        bytes=sizes,
        flops=float(cost.get("flops", 0.0)) if cost else None,
        traced_flops=counted.flops,
        bytes_accessed=float(cost.get("bytes accessed", 0.0)) if cost else None,
        kernel_bytes=counted.kernel_bytes,
        collectives=found,
        collectives_exact=exact,
        loops=" while(" in hlo,
        compile_s=seconds,
        hlo=hlo,
    )


@dataclasses.dataclass(frozen=True)
class TopologyReport:
    """The train and eval steps of a config compiled for a topology.

    `train` and `eval` are None when XLA refused to compile them (`refusal` says why).
    """

    topology: str
    chip: Chip
    device_kind: str
    num_chips: int
    mesh: dict[str, int]
    params: int
    model_flops: int
    train: StepCost | None
    eval: StepCost | None
    refusal: str = ""

    @property
    def needed_bytes(self) -> int:
        """The larger total bytes per chip of the steps XLA compiled (0: neither)."""
        steps = [step for step in (self.train, self.eval) if step is not None]
        return max((step.bytes["total"] for step in steps), default=0)

    @property
    def fits(self) -> bool:
        return not self.refusal and self.needed_bytes <= self.chip.hbm_bytes

    @property
    def flops_per_chip(self) -> float:
        """The larger of XLA's count and the traced matrix products over the chips: each is
        at most what a chip executes (XLA counts a loop's body once; the trace counts only
        matrix products), so the step-time bound stays a lower bound."""
        return max(self.train.flops or 0.0, self.train.traced_flops / self.num_chips)

    @property
    def bytes_per_chip(self) -> float | None:
        """HBM bytes a chip reads and writes in a train step: XLA's count plus the splash
        kernels' streaming it cannot see; None without XLA's cost analysis (GPUs)."""
        if self.train.bytes_accessed is None:
            return None
        return self.train.bytes_accessed + self.train.kernel_bytes / self.num_chips

    @property
    def step_time_lower_bound_s(self) -> float:
        """max(FLOPs per chip / peak, HBM bytes per chip / bandwidth); without XLA's cost
        analysis (GPUs) the FLOPs term alone."""
        return max(
            self.flops_per_chip / self.chip.peak_flops,
            (self.bytes_per_chip or 0.0) / self.chip.hbm_bandwidth,
        )

    @property
    def not_checked(self) -> list[str]:
        """What compiling without the accelerator cannot check (GPUs; a TPU program compiled
        by libtpu is the program a TPU runs)."""
        if not self.chip.is_gpu:
            return []
        unchecked = [
            "autotuning: without a GPU to time them XLA picks GEMM and fusion configurations "
            "by its heuristics; a real GPU's autotuned choices may differ in speed and in "
            "scratch memory",
            "XLA's cost analysis (not implemented for GPU executables): FLOPs are the traced "
            "step's matrix products, and the step-time bound has no HBM-bytes term",
            "memory outside the program: the CUDA context, and jax's preallocation (75% of "
            "the GPU unless XLA_PYTHON_CLIENT_MEM_FRACTION says otherwise); fits compares "
            "the step's bytes with the whole GPU",
        ]
        hlo = self.train.hlo if self.train else ""
        if "__cudnn$" in hlo:
            unchecked.insert(
                0,
                "cuDNN kernels (cuDNN flash attention): XLA builds cuDNN graphs only on a "
                "real GPU, so whether cuDNN accepts these shapes is unchecked and its "
                "workspace is not in the bytes",
            )
        return unchecked

    @property
    def mfu_ceiling(self) -> float:
        peak = self.num_chips * self.chip.peak_flops
        return self.model_flops / (peak * self.step_time_lower_bound_s)

    def summary(self) -> dict:
        """The figures as `--json` writes them (FLOPs per step over all chips, bytes per chip);
        those of a step XLA refused to compile are null."""
        train = self.train
        return {
            "topology": self.topology,
            "chip": self.device_kind,
            "num_chips": self.num_chips,
            "mesh": self.mesh,
            "params": self.params,
            "bytes_per_chip": train.bytes if train else None,
            "hbm_bytes": int(self.chip.hbm_bytes),
            "fits": self.fits,
            "xla_flops": train.flops * self.num_chips if train and train.flops else None,
            "model_flops": self.model_flops,
            "bytes_accessed": train.bytes_accessed if train else None,
            "kernel_bytes_per_chip": train.kernel_bytes / self.num_chips if train else None,
            "step_time_lower_bound_s": self.step_time_lower_bound_s if train else None,
            "mfu_ceiling": self.mfu_ceiling if train else None,
            "collectives": train.collectives if train else None,
            "compile_s": train.compile_s if train else None,
            "not_checked": self.not_checked,
        }


def compile_for_topology(config, topology: str) -> TopologyReport:
    """Compiles `config`'s train and eval steps for `topology`, showing progress on stderr.

    Args:
        config: an experiment config (`configs/*.py`, overrides applied).
        topology: a TPU topology name ('v5e:16x16') or a GPU one ('h100:1x8': hosts x GPUs
            per host).

    Raises:
        ValueError: a bad topology or config value, named as on the command line.
    """
    chip = chip_of(topology)
    if config.model.get("dtype") == compute_dtype.AUTO:
        # The target's choice, not this host's: its matrix units take bfloat16.
        config = copy.deepcopy(config)
        config.model.dtype = compute_dtype.resolve_dtype(
            compute_dtype.AUTO, backend="gpu" if chip.is_gpu else "tpu", shape=(0, 0, 0)
        ).dtype
    experiment = config_lib.validate_config(config)
    compile_costs.check_attention_impl(topology, chip, experiment.model.attention_impl)
    data = experiment.data
    compiler = "the CUDA plugin" if chip.is_gpu else "libtpu"
    with stage(f"loading {compiler} and the {topology} topology"):
        devices = topology_devices(topology, chip)
    mesh = train_lib.make_mesh(experiment.run.mesh_shape, devices)
    task = tasks.get_task(data.task)
    vocab_size = (
        experiment.model.vocab_size  # init_from: the pretrained model's (shapes only)
        if data.init_from
        else model_vocab_size(data.tokenizer, data.vocab_size)
    )
    program = train_lib.build_program(experiment, task, mesh, vocab_size, unk_id=UNK_ID)
    train_batch = abstract_batch(data, task, mesh, evaluation=False)
    eval_batch = abstract_batch(data, task, mesh, evaluation=True)
    train = evaluate = None
    refusal = ""
    try:
        with _cudnn_version_assumed(), stage(f"compiling the train step for {len(devices)} chips"):
            train = _compile(program.train_step, program.state_shapes, train_batch)
        with _cudnn_version_assumed(), stage("compiling the eval step"):
            evaluate = _compile(program.eval_step, program.state_shapes.params, eval_batch)
    except OutOfMemory as err:
        refusal = f"XLA: {err} ({'eval' if train else 'train'} step)"
    shapes = [tuple(train_batch[key].shape) for key in task.model_inputs]
    return TopologyReport(
        topology=topology,
        chip=chip,
        device_kind=devices[0].device_kind,
        num_chips=len(devices),
        mesh=dict(mesh.shape),
        params=sum(leaf.size for leaf in jax.tree.leaves(program.state_shapes.params)),
        model_flops=compile_costs.model_flops(program.model, shapes),
        train=train,
        eval=evaluate,
        refusal=refusal,
    )
