"""What a compiled step costs: TPU chip and NVIDIA GPU figures, the collectives in XLA's HLO
text, and the model's own FLOP count (what the traced step computes: `train.aot.traced_costs`).

Used by `train.compile`; nothing here needs an accelerator, libtpu or the CUDA plugin.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from flax_transformer import TransformerConfig


@dataclasses.dataclass(frozen=True)
class Chip:
    """One TPU generation as Google publishes it, or one NVIDIA GPU as NVIDIA does (per chip).

    Attributes:
        name: the generation ('TPU v5e', 'H100 SXM').
        device_kind: what the compile-only devices of a topology of it report.
        peak_flops: peak bf16 FLOP/s.
        hbm_bytes: HBM capacity in bytes.
        hbm_bandwidth: HBM bytes per second.
        ici_bandwidth: bidirectional inter-chip interconnect bytes per second (a TPU's ICI, a
            GPU's NVLink within a host), or None where the source gives no per-chip figure.
        source: the page the figures come from.
        chip_config: libtpu's chip configuration giving one JAX device per chip, as on a
            TPU VM ('megacore' joins the two TensorCores of v4 and v5p chips).
        target_config: GPUs only: the file under train/aot/gpu_specs/ holding the XLA
            GpuTargetConfigProto that the CUDA plugin compiles for without a GPU.
    """

    name: str
    device_kind: str
    peak_flops: float
    hbm_bytes: float
    hbm_bandwidth: float
    ici_bandwidth: float | None
    source: str
    chip_config: str = "default"
    target_config: str = ""

    @property
    def is_gpu(self) -> bool:
        return bool(self.target_config)

    @property
    def link(self) -> str:
        """The name of the interconnect `ici_bandwidth` measures."""
        return "NVLink" if self.is_gpu else "ICI"


# The figures of Google's Cloud TPU pages ("System architecture" tables), read 2026-12-01.
# HBM capacities are binary: the v4 and v5p pages say GiB; v5e's "16 GB" is 16 GiB, as XLA's
# own limit for it (15.75 GiB usable, in its out-of-memory message) exceeds 16e9 bytes; v6e's
# "32 GB" is read alike. Bandwidths are decimal (GBps = 1e9 bytes/s).
_GiB = 2**30
CHIPS: dict[str, Chip] = {
    # 275 TFLOP/s (bf16), 32 GiB HBM2 at 1200 GBps; no per-chip ICI figure on the page.
    "v4": Chip(
        "TPU v4", "TPU v4", 275e12, 32 * _GiB, 1200e9, None,
        "https://cloud.google.com/tpu/docs/v4", "megacore",
    ),
    # 197 TFLOP/s (bf16), 16 GB HBM2 at 819 GBps, ICI 400 GBps bidirectional per chip.
    "v5e": Chip(
        "TPU v5e", "TPU v5 lite", 197e12, 16 * _GiB, 819e9, 400e9,
        "https://cloud.google.com/tpu/docs/v5e",
    ),
    # 459 TFLOP/s (bf16), 95 GiB HBM2e at 2765 GBps, ICI 1200 GBps bidirectional per chip.
    "v5p": Chip(
        "TPU v5p", "TPU v5", 459e12, 95 * _GiB, 2765e9, 1200e9,
        "https://cloud.google.com/tpu/docs/v5p", "megacore",
    ),
    # 918 TFLOP/s (bf16), 32 GB HBM at 1638 GBps, ICI 800 GBps bidirectional per chip.
    "v6e": Chip(
        "TPU v6e", "TPU v6 lite", 918e12, 32 * _GiB, 1638e9, 800e9,
        "https://cloud.google.com/tpu/docs/v6e",
    ),
}  # fmt: skip

# NVIDIA's product pages (datasheets), read 2026-12-03, SXM parts (the 8-GPU HGX boards).
# NVIDIA gives bf16 Tensor Core FLOP/s "with sparsity"; the dense peak used here is half of
# it. NVLink figures are bidirectional per GPU (as the TPU pages' ICI figures). Memory is
# the `device_memory_size` of the target config XLA compiles for (train/aot/gpu_specs/: what the
# CUDA driver reports, a little under the datasheet's "80 GB"; the H200's file has the
# datasheet's 141 GB, as no H200 was at hand to read it from).
GPUS: dict[str, Chip] = {
    # 1,979 TFLOP/s bf16 with sparsity (989.5 dense), 80 GB HBM3 at 3.35 TB/s, NVLink 900 GB/s.
    "h100": Chip(
        "H100 SXM", "NVIDIA H100 80GB HBM3", 989.5e12, 84978434048, 3.35e12, 900e9,
        "https://www.nvidia.com/en-us/data-center/h100/", target_config="h100_sxm.txtpb",
    ),
    # 1,979 TFLOP/s bf16 with sparsity (989.5 dense), 141 GB HBM3e at 4.8 TB/s, NVLink 900 GB/s.
    "h200": Chip(
        "H200 SXM", "NVIDIA H200", 989.5e12, 141e9, 4.8e12, 900e9,
        "https://www.nvidia.com/en-us/data-center/h200/", target_config="h200_sxm.txtpb",
    ),
    # 624 TFLOP/s bf16 with sparsity (312 dense), 80 GB HBM2e at 2,039 GB/s, NVLink 600 GB/s.
    "a100": Chip(
        "A100 SXM", "NVIDIA A100-SXM4-80GB", 312e12, 85100068864, 2.039e12, 600e9,
        "https://www.nvidia.com/en-us/data-center/a100/", target_config="a100_sxm_80.txtpb",
    ),
}  # fmt: skip

TOPOLOGY_EXAMPLES = (
    "v5e:2x2, v5e:2x4, v5e:16x16, v6e:8x8, v4:2x2x2, v5p:4x4x4; GPUs <kind>:<hosts>x<GPUs per "
    "host>: h100:1x1, h100:1x8, h100:2x8, h200:1x8, a100:1x8"
)
_TOPOLOGY = re.compile(r"^(v4|v5e|v5p|v6e):(\d+x\d+(?:x\d+)?)$")
_GPU_TOPOLOGY = re.compile(r"^(" + "|".join(GPUS) + r"):([1-9]\d*)x([1-9]\d*)$")


def chip_of(topology: str) -> Chip:
    """The chip of a topology name such as 'v5e:16x16' or 'h100:1x8'.

    Raises:
        ValueError: not a generation:shape name of a chip in `CHIPS` or `GPUS`.
    """
    found = _TOPOLOGY.match(topology)
    if found:
        return CHIPS[found.group(1)]
    found = _GPU_TOPOLOGY.match(topology)
    if found:
        return GPUS[found.group(1)]
    raise ValueError(
        f"--topology={topology}: not a TPU or GPU topology this program knows ; use "
        f"<generation>:<chips per dimension>, e.g. {TOPOLOGY_EXAMPLES}"
    )


# The attention kernels that run on one kind of chip only (`--config.model.attention_impl`):
# what each is, and what to use on the other kind instead.
_KERNEL_OF_ONE_KIND = {
    # impl: (runs on GPUs, what it is, the fix elsewhere)
    "splash": (
        False,
        "Pallas splash attention, a TPU kernel",
        "cudnn (cuDNN flash attention) or xla",
    ),
    "cudnn": (
        True,
        "cuDNN flash attention, an NVIDIA GPU kernel",
        "splash (Pallas flash attention) or xla",
    ),
}


def check_attention_impl(topology: str, chip: Chip, attention_impl: str) -> None:
    """Refuses an attention kernel the topology's chips cannot run, before anything compiles
    (the kernel's own lowering would fail deep in the step, with jax's words).

    Raises:
        ValueError: `attention_impl` is 'splash' on GPUs or 'cudnn' on TPUs, naming
            `--config.model.attention_impl` and the fix.
    """
    if attention_impl not in _KERNEL_OF_ONE_KIND:
        return
    on_gpus, kernel, fix = _KERNEL_OF_ONE_KIND[attention_impl]
    if chip.is_gpu == on_gpus:
        return
    chips = "NVIDIA GPUs" if chip.is_gpu else "a TPU slice"
    raise ValueError(
        f"--config.model.attention_impl={attention_impl}: {kernel}, cannot run on {topology} "
        f"({chips}) ; set --config.model.attention_impl={fix}"
    )


def gpu_topology(topology: str) -> str:
    """The CUDA plugin's name of a GPU topology: 'h100:2x8' (2 hosts of 8 GPUs) is '1x2x8'
    (slices x hosts x GPUs per host, as `jax.experimental.topologies` reads it).

    Raises:
        ValueError: not a GPU topology name (`chip_of`).
    """
    found = _GPU_TOPOLOGY.match(topology)
    if not found:
        chip_of(topology)  # raises for an unknown name
        raise ValueError(f"--topology={topology}: not a GPU topology")
    return f"1x{found.group(2)}x{found.group(3)}"


COLLECTIVES = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")

# Bytes per element of the HLO element types a step can hold.
_ELEMENT_BYTES = {
    "pred": 1, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1,
    "s16": 2, "u16": 2, "f16": 2, "bf16": 2,
    "s32": 4, "u32": 4, "f32": 4,
    "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16,
}  # fmt: skip
_ARRAY = re.compile(r"\b(" + "|".join(_ELEMENT_BYTES) + r")\[([\d,]*)\]")
# `%name = SHAPE kind(` or its asynchronous `kind-done(` (whose result is the same array;
# `-start` is skipped, or each would count twice). The shape may be a tuple.
_INSTRUCTION = re.compile(
    r"^\s*(?:ROOT\s+)?%\S+\s*=\s*(.*?)\s(" + "|".join(COLLECTIVES) + r")(-done)?\("
)
_HEADER = re.compile(r"^(ENTRY\s+)?%(\S+)\s.*?(?:->\s*(.*?))?\s*\{\s*$")
# libtpu's reduce-scatter: a fusion computation named `all-reduce-scatter.N` holding an
# all-reduce of the whole array and the dynamic-slice of this chip's shard (its result).
_REDUCE_SCATTER_FUSION = "all-reduce-scatter"
_CALLEE = re.compile(
    r"\b(calls|body|condition|to_apply|true_computation|false_computation)=%([\w.\-]+)"
)
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_WHILE = re.compile(r"\swhile\(.*\bcondition=%([\w.\-]+),\s*body=%([\w.\-]+)")
_CHANNEL = re.compile(r"\bchannel_id=(\d+)")
_TRIP_COUNT = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')
_LOOP_BOUND = re.compile(r"\b[su](?:32|64)\[\]\S*\s+constant\((\d+)\)")


def _shape_bytes(shape: str) -> int:
    total = 0
    for dtype, dims in _ARRAY.findall(shape):
        count = 1
        for dim in filter(None, dims.split(",")):
            count *= int(dim)
        total += count * _ELEMENT_BYTES[dtype]
    return total


def _computations(hlo_text: str) -> tuple[dict[str, list[str]], dict[str, str], str]:
    """The HLO module's computations (name -> instruction lines), their result shapes (name
    -> the header's text after '->') and the entry's name."""
    computations: dict[str, list[str]] = {}
    results: dict[str, str] = {}
    entry, current = "", None
    for line in hlo_text.splitlines():
        header = _HEADER.match(line)
        if header and current is None:
            current = header.group(2)
            computations[current] = []
            results[current] = header.group(3) or ""
            if header.group(1):
                entry = current
        elif line.strip() == "}" and current is not None:
            current = None
        elif current is not None:
            computations[current].append(line)
    return computations, results, entry


def _trip_count(line: str, condition: list[str]) -> int | None:
    """Iterations of a while loop: XLA's known trip count, else the bound of the `i < N`
    condition that `lax.scan` (nn.scan) lowers to; None when neither is there."""
    known = _TRIP_COUNT.search(line)
    if known:
        return int(known.group(1))
    bounds = {int(n) for text in condition for n in _LOOP_BOUND.findall(text)}
    compares = [text for text in condition if "compare(" in text and "direction=LT" in text]
    return bounds.pop() if len(bounds) == 1 and len(compares) == 1 else None


def collectives(hlo_text: str) -> tuple[dict[str, dict[str, int]], bool]:
    """Count and bytes of each kind of collective one execution of the program runs.

    Bytes are each collective's result per chip (an all-gather's gathered array, a
    reduce-scatter's shard), summed. A collective inside a while loop (the layers of
    `scan_layers=True`) counts once per iteration. XLA may split one collective into
    pieces in several fusions (TPU's asynchronous collective fusions), each holding the
    whole instruction: pieces with the same `channel_id` within one loop iteration count
    once.

    On TPUs a reduce-scatter is not a `reduce-scatter` instruction: libtpu fuses the all-reduce
    of the whole array with the dynamic-slice keeping this chip's shard into one
    `all-reduce-scatter` fusion, which it runs as a reduce-scatter (ring: each chip sends and
    receives (n - 1) / n of the array once, half an all-reduce's traffic). An all-reduce inside
    such a fusion counts as a reduce-scatter, its bytes the fusion's result (the shard).

    Args:
        hlo_text: the compiled program's HLO text (`jax.stages.Compiled.as_text()`).

    Returns:
        ({kind: {'count', 'bytes'}} for every kind in COLLECTIVES, exact): `exact` is
        False when a loop's trip count could not be read (its collectives counted once).
    """
    computations, results, entry = _computations(hlo_text)
    loops: dict[str, tuple[dict[str, list[int]], bool]] = {}

    def per_iteration(root: str) -> tuple[dict[str, list[int]], bool]:
        """The collectives of one run of `root`, the loops it starts included."""
        if root in loops:
            return loops[root]
        found = {kind: [0, 0] for kind in COLLECTIVES}
        pieces: dict[str, tuple[str, int]] = {}  # channel (or line) -> kind, bytes
        exact, walked, pending = True, set(), [root]
        while pending:
            name = pending.pop()
            if name in walked:
                continue
            walked.add(name)
            for number, line in enumerate(computations.get(name, [])):
                instruction = _INSTRUCTION.match(line)
                if instruction:
                    channel = _CHANNEL.search(line)
                    key = channel.group(1) if channel else f"{name}:{number}"
                    kind, shape = instruction.group(2), instruction.group(1)
                    if kind == "all-reduce" and name.startswith(_REDUCE_SCATTER_FUSION):
                        kind, shape = "reduce-scatter", results[name]
                    pieces.setdefault(key, (kind, _shape_bytes(shape)))
                callees = [callee for _, callee in _CALLEE.findall(line)]
                for branches in _BRANCHES.findall(line):
                    callees += [b.strip().lstrip("%") for b in branches.split(",")]
                loop = _WHILE.search(line)
                if loop:  # its body runs `trips` times, each a scope of its own
                    condition, body = loop.groups()
                    trips = _trip_count(line, computations.get(condition, []))
                    inner, inner_exact = per_iteration(body)
                    exact &= inner_exact and trips is not None
                    for kind, (count, size) in inner.items():
                        found[kind][0] += (trips or 1) * count
                        found[kind][1] += (trips or 1) * size
                    callees = [c for c in callees if c not in (condition, body)]
                pending += callees
        for kind, size in pieces.values():
            found[kind][0] += 1
            found[kind][1] += size
        loops[root] = (found, exact)
        return loops[root]

    found, exact = per_iteration(entry)
    return {kind: {"count": c, "bytes": b} for kind, (c, b) in found.items()}, exact


def _layer_matmul_params(config: TransformerConfig) -> tuple[int, int, int]:
    """Per layer: (Q + output projection, K + V projection, feed-forward) kernel sizes."""
    width = config.num_heads * config.head_dim
    gated = config.activation in ("swiglu", "geglu")
    query_out = 2 * config.d_model * width
    key_value = 2 * config.d_model * config.kv_heads * config.head_dim
    ffn = (3 if gated else 2) * config.d_model * config.d_ff
    return query_out, key_value, ffn


def model_flops(model, input_shapes: Sequence[tuple[int, ...]]) -> int:
    """Training FLOPs of one step by the model's formula: 6 per parameter of every matrix
    product per token it sees (2 forward, 4 backward), plus the attention products
    (q k^T and weights v, 2 FLOPs per multiply-add, times 3 for training).

    Convention: causal (and padding or segment) masks are counted in full, as computed,
    not halved; embedding lookups, norms, softmax and the optimizer are not counted, nor
    the forward recomputed by `remat`. The output projection counts (tied or not).

    Args:
        model: a `Transformer` or `DecoderOnlyTransformer`.
        input_shapes: the model inputs' `(B, L)` shapes: (source, target) for a
            `Transformer`, (tokens,) for a decoder-only model.

    Returns:
        FLOPs of one train step over the whole batch (all chips together).
    """
    from flax_transformer import Transformer

    config: TransformerConfig = model.config
    query_out, key_value, ffn = _layer_matmul_params(config)
    width = config.num_heads * config.head_dim
    vocab = config.output_vocab_size
    if isinstance(model, Transformer):
        (batch, source), (_, target) = input_shapes
        encoder = config.encoder_layers * (
            batch * source * (query_out + key_value + ffn) + 2 * batch * source * source * width
        )
        decoder = config.decoder_layers * (
            batch * target * (2 * query_out + key_value + ffn)  # self and cross Q, O
            + batch * source * key_value  # cross-attention keys and values of the source
            + 2 * batch * target * (target + source) * width
        )
        forward = encoder + decoder + batch * target * config.d_model * vocab
    else:
        ((batch, length),) = input_shapes
        forward = config.decoder_layers * (
            batch * length * (query_out + key_value + ffn) + 2 * batch * length * length * width
        )
        forward += batch * length * config.d_model * vocab
    return 3 * 2 * forward
