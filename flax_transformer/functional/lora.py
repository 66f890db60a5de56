"""The LoRA update of a kernel: `W + (alpha / r) * A @ B` (Hu et al. 2021, arXiv:2106.09685)."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def lora_delta(a: jax.Array, b: jax.Array, scale: float) -> jax.Array:
    """The low-rank update `scale * A @ B` of one kernel, in float32.

    A kernel's input axes lead and its output axes follow (`(D, N, H)` for queries,
    `(N, H, D)` for the attention output), so A carries the input axes and the rank last,
    B the rank first and the output axes: their product has the kernel's shape.

    Args:
      a: `(*in, r)`, the down-projection to rank r.
      b: `(r, *out)`, the up-projection (zeros at initialisation: no update).
      scale: `alpha / r`.

    Returns:
      `(*in, *out)` float32 (the adapters train in float32 whatever the kernel's dtype).
    """
    if a.ndim < 2 or b.ndim < 2 or a.shape[-1] != b.shape[0]:
        raise ValueError(
            f"lora_delta: a must be (*in, r) and b (r, *out) with the same r, got "
            f"{a.shape=}, {b.shape=}."
        )
    a32, b32 = a.astype(jnp.float32), b.astype(jnp.float32)
    return scale * jnp.tensordot(a32, b32, axes=1)
