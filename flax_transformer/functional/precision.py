"""The mixed-precision policy of every matmul and einsum, said in one place.

Parameters are stored in float32 (`param_dtype`). Every matrix product of the models (the
Dense projections, attention's `q . k` and `p . v` in every `attention_impl` and over a KV
cache, the vocabulary head) takes its operands in the compute dtype (`dtype`: float32 or
bfloat16) and accumulates AND returns in float32 (`preferred_element_type`); the caller
rounds the result to the compute dtype only where the next operation wants that operand
(the next matmul, the residual stream). Softmax, norms and the loss stay in float32.

Why: TPU MXUs and GPU tensor cores multiply bfloat16 and accumulate in float32, and on a
Xeon with AMX XLA runs a dot on the matrix units only when it returns float32 (issue 58:
566 GFLOP/s against 181 for the same dot returning bfloat16, 158 in float32). It is also
the more accurate form: one rounding of the float32 sum instead of a bfloat16 result.

In float32 nothing changes: float32 operands with a float32 accumulator are the plain
product, bit for bit. float64 operands (under `jax_enable_x64`) accumulate in float64.

LoRA's `A @ B` is a product of float32 adapters (`functional.lora_delta`), computed at
their dtype: it forms a weight, not an activation, and a small update rounded to bfloat16
before it is added to the kernel would round away. The adapted kernel then enters its
projection in the compute dtype like any other.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp


def accumulation_dtype(*dtypes: Any) -> jnp.dtype:
    """The dtype a product of operands in `dtypes` accumulates in and returns.

    float32 for bfloat16, float16 and float32 operands; float64 if one is float64.
    """
    return jnp.promote_types(jnp.result_type(*dtypes), jnp.float32)


def mixed_einsum(spec: str, *operands: jax.Array, dtype: Any = None) -> jax.Array:
    """`jnp.einsum(spec, *operands)` under the policy: operands in `dtype`, sum in float32.

    Args:
      spec: the einsum subscripts, e.g. `'th,sh->ts'`.
      *operands: the arrays, of any floating dtype.
      dtype: the compute dtype the operands are cast to first; None: their common dtype.

    Returns:
      The product in `accumulation_dtype(dtype)` (float32, or float64 for float64): not
      rounded to `dtype`; the caller does that where the next operation wants it.
    """
    if dtype is None:
        dtype = jnp.result_type(*operands)
    cast = [jnp.asarray(x).astype(dtype) for x in operands]
    return jnp.einsum(spec, *cast, preferred_element_type=accumulation_dtype(dtype))


def mixed_dot_general(
    lhs: jax.Array,
    rhs: jax.Array,
    dimension_numbers: Any,
    precision: Any = None,
    preferred_element_type: Any = None,
    **kwargs: Any,
) -> jax.Array:
    """`jax.lax.dot_general` accumulating in float32: the `dot_general` of linen's Dense.

    Linen's `Dense`/`DenseGeneral` cast inputs and kernel to their `dtype` first and call
    this in place of `lax.dot_general` (`nn.DenseGeneral(..., dot_general=mixed_dot_general)`),
    so their output is float32 (plus the bias, promoted). A `preferred_element_type` passed
    explicitly wins.
    """
    if preferred_element_type is None:
        preferred_element_type = accumulation_dtype(lhs.dtype, rhs.dtype)
    return jax.lax.dot_general(
        lhs,
        rhs,
        dimension_numbers,
        precision=precision,
        preferred_element_type=preferred_element_type,
        **kwargs,
    )


__all__ = ["accumulation_dtype", "mixed_dot_general", "mixed_einsum"]
