"""train.aot.traced_costs: the FLOPs and HBM bytes of the Pallas splash kernels, counted from
their shapes, against splash's own tile map and kernel bodies and against the dense path.

Tracing only: nothing here compiles for a TPU, so no libtpu is needed.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas.ops.tpu.splash_attention import (
    splash_attention_mask as splash_mask,
)
from jax.experimental.pallas.ops.tpu.splash_attention import (
    splash_attention_mask_info as splash_info,
)

from flax_transformer.functional.masks import AttentionMask
from flax_transformer.layers.attention_op import SPLASH_SCOPES, attention_op
from train.aot import traced_costs


def _pallas_calls(jaxpr) -> list:
    """The pallas_call equations of a jaxpr, nested ones included, in order."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "pallas_call":
            found.append(eqn)
            continue
        for value in eqn.params.values():
            for sub in traced_costs._sub_jaxprs(value):
                found += _pallas_calls(sub)
    return found


def _dot_shapes(jaxpr) -> list[tuple[int, ...]]:
    """(output shape + contracted sizes) of every dot_general in a kernel body."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            (contracting, _), _ = eqn.params["dimension_numbers"]
            lhs = eqn.invars[0].aval.shape
            found.append((*eqn.outvars[0].aval.shape, *(lhs[d] for d in contracting)))
        for value in eqn.params.values():
            for sub in traced_costs._sub_jaxprs(value):
                found += _dot_shapes(sub)
    return found


def _qkv(batch=2, length=512, heads=4, kv_heads=4, head_dim=64):
    q = jnp.zeros((batch, length, heads, head_dim), jnp.bfloat16)
    k = jnp.zeros((batch, length, kv_heads, head_dim), jnp.bfloat16)
    return q, k, k


def _splash_jaxpr(mask, *, grad: bool, **shapes):
    """The jaxpr of splash attention (forward, or forward and backward) for bf16 q, k, v."""

    def forward(q, k, v):
        return attention_op(q, k, v, mask, impl="splash")[0].astype(jnp.float32).sum()

    fn = jax.grad(forward, argnums=(0, 1, 2)) if grad else forward
    return jax.make_jaxpr(fn)(*_qkv(**shapes)).jaxpr


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(
    ("q_len", "kv_len", "block_q", "block_kv"),
    [(512, 512, 128, 128), (2048, 2048, 512, 512), (1024, 1024, 256, 128), (512, 512, 128, 256)],
)
def test_computed_tiles_are_those_splash_marks(causal, q_len, kv_len, block_q, block_kv):
    """The count of tiles a kernel computes equals the tiles splash's own mask info marks as
    partly or fully visible (the kernel skips the tiles marked 0)."""
    shape = (q_len, kv_len)
    head = splash_mask.CausalMask(shape) if causal else splash_mask.FullMask(shape)
    forward, _ = splash_info.process_mask(splash_mask.MultiHeadMask([head]), (block_q, block_kv))
    marked = int(np.count_nonzero(forward.block_mask[0]))
    assert traced_costs.splash_tiles(q_len, kv_len, block_q, block_kv, causal) == marked
    if causal and block_q == block_kv:
        rows = q_len // block_q
        assert marked == rows * (rows + 1) // 2  # on or below the diagonal


def test_products_per_tile_are_the_kernel_bodies_matrix_products():
    """SPLASH_PRODUCTS is what each kernel's body computes per grid step: that many
    (block_q x block_kv x H) products (one tile: block_kv_compute is the whole tile)."""
    jaxpr = _splash_jaxpr(AttentionMask(causal=True), grad=True, batch=1, length=512)
    kernels = {}
    for eqn in _pallas_calls(jaxpr):
        kernel = eqn.params["name"].split("_")[2]
        kernels.setdefault(kernel, _dot_shapes(eqn.params["jaxpr"]))
    assert set(kernels) == set(traced_costs.SPLASH_PRODUCTS)
    for kernel, dots in kernels.items():
        assert len(dots) == traced_costs.SPLASH_PRODUCTS[kernel], (kernel, dots)
        # Each a tile's product: 512 x 512 tiles and a head width of 64, in some order.
        assert all(sorted(dot) == [64, 512, 512] for dot in dots), (kernel, dots)


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_forward_flops_with_a_full_mask_equal_the_dense_path(kv_heads):
    """Where both compute the same products (a full mask: no tile skipped), the splash
    forward counts what the dense path's dot_generals do: q k^T and weights v."""
    shapes = dict(batch=2, length=512, heads=4, kv_heads=kv_heads)
    splash = traced_costs.traced_costs(_splash_jaxpr(None, grad=False, **shapes))

    def dense(q, k, v):
        return attention_op(q, k, v, None, impl="xla")[0].astype(jnp.float32).sum()

    xla = traced_costs.traced_costs(jax.make_jaxpr(dense)(*_qkv(**shapes)).jaxpr)
    assert splash.flops == xla.flops == 2 * 2 * (2 * 4 * 512 * 512 * 64)


def test_causal_mask_counts_the_tiles_on_and_below_the_diagonal():
    """The mask comes from the named scope around the kernels: causal with 4 x 4 tiles of
    512 computes 10 of the 16 tiles of the full mask, in each of the three kernels."""
    shapes = dict(batch=1, length=2048, heads=2, kv_heads=2)

    def kernels(mask) -> traced_costs.TracedCost:
        jaxpr = _splash_jaxpr(mask, grad=True, **shapes)
        scope = SPLASH_SCOPES[mask is not None]
        return sum(
            (traced_costs._splash_cost(eqn, scope) for eqn in _pallas_calls(jaxpr)),
            traced_costs.TracedCost(),
        )

    full, causal = kernels(None), kernels(AttentionMask(causal=True))
    # The named scope carries the mask into the whole step's count.
    whole = traced_costs.traced_costs(
        _splash_jaxpr(AttentionMask(causal=True), grad=True, **shapes)
    )
    assert whole.kernel_bytes == causal.kernel_bytes
    per_tile = 2 * 512 * 512 * 64 * 2  # 2 FLOPs per multiply-add, 2 heads
    products = sum(traced_costs.SPLASH_PRODUCTS.values())  # fwd + dq + dkv under grad
    assert full.flops == 16 * products * per_tile
    assert causal.flops == 10 * products * per_tile
    assert 0 < causal.kernel_bytes < full.kernel_bytes


@pytest.mark.parametrize("kernel", ["fwd", "dq", "dkv"])
def test_one_tile_moves_each_array_once(kernel):
    """With one tile (block = the whole sequence) and no segment ids, a kernel reads each
    operand and writes each result once: the formula's bytes equal the sizes of the
    kernel's q/k/v-shaped and logsumexp operands and results (not its int8 tile map or its
    per-tile f32 scratch outputs), and nothing is added to what XLA counts."""
    jaxpr = _splash_jaxpr(None, grad=True, batch=1, length=512)
    (eqn,) = [e for e in _pallas_calls(jaxpr) if e.params["name"].split("_")[2] == kernel]
    arrays = [
        v.aval
        for v in (*eqn.invars, *eqn.outvars)
        if v.aval.ndim == 3 and jnp.issubdtype(v.aval.dtype, jnp.floating)
    ]
    _, moved = traced_costs.splash_costs(
        kernel,
        batch=1,
        heads=4,
        kv_heads=4,
        q_len=512,
        kv_len=512,
        head_dim=64,
        itemsize=2,
        block_q=512,
        block_kv=512,
        causal=False,
        segmented=False,
        residuals=kernel == "fwd",
    )
    assert moved == sum(a.size * a.dtype.itemsize for a in arrays)
    assert traced_costs._splash_cost(eqn, "").kernel_bytes == 0


def test_streamed_keys_and_values_are_read_once_per_query_tile():
    """Four query tiles of a full mask: the forward reads k and v four times, three more
    than once (the bytes added to XLA's count), and q and o once."""
    common = dict(
        batch=1, heads=1, kv_heads=1, q_len=2048, kv_len=2048, head_dim=64, itemsize=2,
        causal=False, segmented=False, residuals=False,
    )  # fmt: skip
    _, one_tile = traced_costs.splash_costs("fwd", block_q=2048, block_kv=2048, **common)
    _, four_rows = traced_costs.splash_costs("fwd", block_q=512, block_kv=512, **common)
    assert four_rows - one_tile == 3 * 2 * (2048 * 64 * 2)
