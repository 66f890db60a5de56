"""What a traced step computes and moves, counted from its jaxpr where XLA cannot see: the
matrix products of every `dot_general`, and those inside fused attention kernels (cuDNN's
flash attention on GPUs, the Pallas splash kernels on TPUs), with the HBM traffic of the
splash kernels.

XLA's cost analysis treats a custom call (a cuDNN or Pallas kernel) as opaque: it counts no
FLOPs in it, and at most its operands and results once, while a flash-attention kernel
streams the keys and values once per block of queries (or queries once per block of keys).
`train.compile` adds what is counted here to XLA's figures.

Splash kernels (jax 0.10.2, jax.experimental.pallas.ops.tpu.splash_attention), per batch
row and query head; T, S the query and key lengths, H the head width, bq x bkv a kernel's
tile, V the tiles it computes (every tile of the T/bq x S/bkv grid for a full mask; those on
or below the diagonal for a causal one: the kernel skips the others), b the bytes of an
element of q:

    kernel  matrix products per tile (bq x bkv x H each)          HBM bytes
    fwd     q k^T, p v                                   (2)      q, o: T H b each; k, v:
                                                                  V bkv H b each; logsumexp
                                                                  (training): T 128 4
    dq      q k^T, do v^T, ds k                          (3)      q, do, dq: T H b each;
                                                                  logsumexp, di: T 4 each;
                                                                  k, v: V bkv H b each
    dkv     q k^T, do v^T, p^T do, ds^T q                (4)      k, v, dk, dv: S H b each;
                                                                  q, do: V bq H b each;
                                                                  logsumexp, di: V bq 8 4

FLOPs are 2 per multiply-add. With segment ids, the query ids (128 lanes of int32 per query)
are read once per query tile row and the key ids (8 sublanes per key) once per computed tile
in fwd and dq, and the other way round in dkv. Compared with the dense path (q k^T and p v
forward; dV, dP, dQ, dK backward: 2 + 4 products), the backward recomputes q k^T twice and
do v^T once more (2 + 7), and under a causal mask skips the tiles above the diagonal.
"""

from __future__ import annotations

import dataclasses
import json
import math

import jax.numpy as jnp

from flax_transformer.layers.attention_op import SPLASH_SCOPES

# jax's cuDNN attention primitives (jax._src.cudnn.fused_attention_stablehlo): the matrix
# products of each, in units of B*N*T*S*H multiply-adds. Forward: q k^T and weights v (2).
# Backward (flash attention keeps no weights): q k^T again, then dV, dP, dQ, dK (5).
_CUDNN_ATTENTION = {
    "dot_product_attention_fwd": 2,
    "dot_product_attention_fwd_wrapper": 2,
    "dot_product_attention_bwd": 5,
    "dot_product_attention_bwd_wrapper": 5,
}
_CUDNN_CAUSAL_MASKS = (2, 3)  # MaskType.CAUSAL, MaskType.PADDING_CAUSAL
_CUDNN_BNTH = 1  # AttentionLayout.BNTH (else BTNH)

# Splash's kernels by the prefix of their Pallas name: matrix products per tile, and the
# names of their tile sizes in the BlockSizes the kernel records in its metadata.
SPLASH_PRODUCTS = {"fwd": 2, "dq": 3, "dkv": 4}
_SPLASH_TILES = {
    "fwd": ("block_q", "block_kv"),
    "dq": ("block_q_dq", "block_kv_dq"),
    "dkv": ("block_q_dkv", "block_kv_dkv"),
}
_LANES, _SUBLANES = 128, 8  # a TPU vector register: splash pads its f32/int32 rows to these
_F32 = 4


@dataclasses.dataclass(frozen=True)
class TracedCost:
    """What a traced program computes, over the whole (unsharded) arrays.

    Attributes:
        flops: FLOPs of its matrix products (`dot_general`, cuDNN and splash attention).
        kernel_bytes: HBM bytes the splash kernels move beyond reading each operand and
            writing each result once (what XLA's cost analysis may count of them).
    """

    flops: int = 0
    kernel_bytes: int = 0

    def __add__(self, other: TracedCost) -> TracedCost:
        return TracedCost(self.flops + other.flops, self.kernel_bytes + other.kernel_bytes)

    def __mul__(self, times: int) -> TracedCost:
        return TracedCost(self.flops * times, self.kernel_bytes * times)


def _sub_jaxprs(value) -> list:
    """The jaxprs in one equation parameter (a jaxpr, a closed jaxpr, or a tuple of them)."""
    values = value if isinstance(value, tuple | list) else (value,)
    return [getattr(v, "jaxpr", v) for v in values if hasattr(v, "eqns") or hasattr(v, "jaxpr")]


def cudnn_attention_flops(eqn) -> int:
    """FLOPs of one cuDNN attention equation (forward or backward) from its shapes: 2 per
    multiply-add of its matrix products (`_CUDNN_ATTENTION`); a causal mask halves them, as
    cuDNN skips the tiles above the diagonal (so the count stays a lower bound)."""
    query, value = eqn.invars[0].aval.shape, eqn.invars[2].aval.shape
    if eqn.params.get("layout") == _CUDNN_BNTH:
        batch, heads, q_len, head_dim = query
        kv_len = value[2]
    else:
        batch, q_len, heads, head_dim = query
        kv_len = value[1]
    products = _CUDNN_ATTENTION[eqn.primitive.name] * batch * heads * q_len * kv_len * head_dim
    mask = getattr(eqn.params.get("mask_type"), "value", eqn.params.get("mask_type"))
    if mask in _CUDNN_CAUSAL_MASKS:
        products //= 2
    return 2 * products


def splash_tiles(q_len: int, kv_len: int, block_q: int, block_kv: int, causal: bool) -> int:
    """Tiles a splash kernel computes of its (q_len / block_q) x (kv_len / block_kv) grid:
    all of them for a full mask; for a causal one (query t sees keys s <= t) those holding
    at least one visible pair, i.e. tile (i, j) with j * block_kv <= (i + 1) * block_q - 1."""
    rows, columns = q_len // block_q, kv_len // block_kv
    if not causal:
        return rows * columns
    return sum(min(columns, ((i + 1) * block_q - 1) // block_kv + 1) for i in range(rows))


def splash_costs(
    kernel: str,
    *,
    batch: int,
    heads: int,
    kv_heads: int,
    q_len: int,
    kv_len: int,
    head_dim: int,
    itemsize: int,
    block_q: int,
    block_kv: int,
    causal: bool,
    segmented: bool,
    residuals: bool,
) -> tuple[int, int]:
    """(FLOPs, HBM bytes) of one call of a splash kernel, by the module docstring's table.

    Args:
        kernel: 'fwd', 'dq' or 'dkv'.
        batch, heads, kv_heads, q_len, kv_len, head_dim: B, N, K, T, S, H of the call.
        itemsize: bytes of an element of q, k and v (2 for bfloat16).
        block_q, block_kv: the kernel's tile.
        causal: the mask is causal (else full).
        segmented: segment ids are passed (their rows are read too).
        residuals: the forward writes the logsumexp for the backward (training).
    """
    tiles = splash_tiles(q_len, kv_len, block_q, block_kv, causal)
    flops = 2 * SPLASH_PRODUCTS[kernel] * tiles * block_q * block_kv * head_dim
    q_bytes, k_bytes = q_len * head_dim * itemsize, kv_len * head_dim * itemsize
    if kernel == "fwd":
        moved = 2 * q_bytes + 2 * tiles * block_kv * head_dim * itemsize
        moved += residuals * q_len * _LANES * _F32
        ids = q_len * _LANES * _F32 + tiles * _SUBLANES * block_kv * _F32
    elif kernel == "dq":
        moved = 3 * q_bytes + 2 * q_len * _F32 + 2 * tiles * block_kv * head_dim * itemsize
        ids = q_len * _LANES * _F32 + tiles * _SUBLANES * block_kv * _F32
    else:  # dkv
        moved = 2 * k_bytes + 2 * tiles * block_q * head_dim * itemsize
        moved += 2 * tiles * block_q * _SUBLANES * _F32
        moved += 2 * k_bytes * kv_heads // heads  # dk, dv: one per key/value head
        ids = kv_len * _LANES * _F32 + tiles * _SUBLANES * block_q * _F32
    per_head = flops, moved + segmented * ids
    return batch * heads * per_head[0], batch * heads * per_head[1]


def _aval_bytes(var) -> int:
    aval = getattr(var, "aval", None)
    if aval is None or not hasattr(aval, "shape"):
        return 0
    return math.prod(aval.shape) * aval.dtype.itemsize


def _splash_cost(eqn, scope: str) -> TracedCost | None:
    """The cost of a `pallas_call` equation that is a splash kernel (None if it is not one):
    its shapes from q and k (its first two floating operands of 3 or more dimensions; a
    leading 4th is the batch that `jax.vmap` added), its tiles from its recorded BlockSizes,
    and its mask from the named scope `attention_op` opens around it (`SPLASH_SCOPES`)."""
    name = str(eqn.params.get("name", ""))
    kernel = name.split("_")[2] if name.startswith("splash_mha_") else ""
    if kernel not in SPLASH_PRODUCTS:
        return None
    floats = [
        v.aval.shape
        for v in eqn.invars
        if len(getattr(v.aval, "shape", ())) >= 3 and jnp.issubdtype(v.aval.dtype, jnp.floating)
    ]
    q_shape, k_shape = floats[0], floats[1]
    batch = q_shape[0] if len(q_shape) == 4 else 1
    heads, q_len, head_dim = q_shape[-3:]
    kv_heads, kv_len = k_shape[-3], k_shape[-2]
    metadata = json.loads(dict(eqn.params.get("metadata") or {}).get("xprof_metadata", "{}"))
    block_q, block_kv = (metadata.get(key) for key in _SPLASH_TILES[kernel])
    flops, moved = splash_costs(
        kernel,
        batch=batch,
        heads=heads,
        kv_heads=kv_heads,
        q_len=q_len,
        kv_len=kv_len,
        head_dim=head_dim,
        itemsize=next(v.aval.dtype.itemsize for v in eqn.invars if v.aval.shape == q_shape),
        block_q=block_q or q_len,
        block_kv=block_kv or kv_len,
        causal=SPLASH_SCOPES[True] in scope,
        segmented="_segmented" in name,
        residuals=name.endswith("_residuals") and not name.endswith("_no_residuals"),
    )
    once = sum(_aval_bytes(v) for v in (*eqn.invars, *eqn.outvars))
    return TracedCost(flops, max(moved - once, 0))


def traced_costs(jaxpr, scope: str = "") -> TracedCost:
    """The matrix-product FLOPs and splash kernel traffic of a traced program over the whole
    (unsharded) arrays: a `scan` body times its length, a `shard_map` body (one device's
    shard) times the devices it runs on, the forward that `remat` recomputes included; a
    `while` body (unknown trips) counted once and the cheapest branch of a `cond`, so that
    the figures stay lower bounds.

    Args:
        jaxpr: a traced function's jaxpr (`jax.jit(f).trace(*args).jaxpr`).
        scope: the named scopes around it (the callers' name stacks).
    """
    total = TracedCost()
    for eqn in getattr(jaxpr, "jaxpr", jaxpr).eqns:
        name = eqn.primitive.name
        here = f"{scope}/{eqn.source_info.name_stack}"
        if name in _CUDNN_ATTENTION:
            total += TracedCost(cudnn_attention_flops(eqn))
            continue
        if name == "pallas_call":
            total += _splash_cost(eqn, here) or TracedCost()
            continue
        if name == "dot_general":
            (contracting, _), _ = eqn.params["dimension_numbers"]
            lhs = eqn.invars[0].aval.shape
            products = math.prod(eqn.outvars[0].aval.shape)
            products *= math.prod(lhs[d] for d in contracting)
            total += TracedCost(2 * products)
            continue
        inner = [sub for value in eqn.params.values() for sub in _sub_jaxprs(value)]
        costs = [traced_costs(sub, here) for sub in inner]
        if name == "cond":
            total += min(costs, key=lambda cost: cost.flops, default=TracedCost())
            continue
        times = eqn.params.get("length", 1) if name == "scan" else 1
        if name == "shard_map":
            shape = eqn.params["mesh"].shape
            times = math.prod(shape[axis] for axis in eqn.params.get("newly_manual_axes", ()))
        total += sum(costs, TracedCost()) * times
    return total


def traced_matmul_flops(jaxpr) -> int:
    """FLOPs of the matrix products a traced program executes (`traced_costs(jaxpr).flops`)."""
    return traced_costs(jaxpr).flops
