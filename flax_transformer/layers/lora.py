"""LoRA adapters on the layers' kernels (Hu et al. 2021, arXiv:2106.09685).

A targeted kernel W `(*in, *out)` is used as `W + (alpha / r) * A @ B` with A `(*in, r)`
and B `(r, *out)` (`functional.lora_delta`). A starts uniform in +-1/sqrt(fan_in), as PEFT's
kaiming-uniform with a = sqrt(5) gives, and B at zeros, so a fresh adapter changes nothing.
Both are float32 whatever `param_dtype`: a small update summed in bfloat16 would round away.

Each adapter pair is a child module `lora_<target>` (`lora_q`, `lora_up`, ...) of the layer
whose kernel it adapts, with params `lora_a` and `lora_b`. A child scope draws its init rng
from its own name, so adding adapters leaves the layer's other params (and their init)
exactly as without them. A fused kernel (Q/K/V, K/V) gets one pair per targeted part.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import jax
import jax.numpy as jnp
from flax import linen as nn

from flax_transformer import axes
from flax_transformer.config import LORA_TARGETS
from flax_transformer.functional.lora import lora_delta
from flax_transformer.layers.initializers import partitioned, zeros_init

# The adapters' storage dtype, whatever the layer's param_dtype (module docstring).
LORA_DTYPE = jnp.float32


def _uniform_fan_in(fan_in: int):
    """uniform(-1/sqrt(fan_in), 1/sqrt(fan_in)): PEFT's `kaiming_uniform_(a=sqrt(5))` of A."""
    bound = 1.0 / math.sqrt(fan_in)

    def init(key, shape, dtype=LORA_DTYPE):
        return jax.random.uniform(key, shape, dtype, -bound, bound)

    return init


class LoRA(nn.Module):
    """One adapter pair: returns the float32 update `(alpha / rank) * A @ B` `(*in, *out)`.

    Attributes:
      rank: r >= 1.
      alpha: the scale's numerator.
      in_names, out_names: logical axis names of the kernel's input and output axes.
    """

    rank: int
    alpha: float
    in_names: tuple[str, ...]
    out_names: tuple[str, ...]

    @nn.compact
    def __call__(self, in_shape: tuple[int, ...], out_shape: tuple[int, ...]) -> jax.Array:
        a_init = partitioned(_uniform_fan_in(math.prod(in_shape)), (*self.in_names, axes.LORA))
        a = self.param("lora_a", a_init, (*in_shape, self.rank), LORA_DTYPE)
        b_init = partitioned(zeros_init, (axes.LORA, *self.out_names))
        b = self.param("lora_b", b_init, (self.rank, *out_shape), LORA_DTYPE)
        return lora_delta(a, b, self.alpha / self.rank)


def _check_fields(rank: Any, alpha: Any, targets: Any) -> None:
    """A layer built directly (not from a config) gets the config's checks of its fields."""
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise ValueError(f"lora_rank={rank!r} must be an integer >= 0 (0 = no LoRA adapters).")
    if rank == 0:
        return
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not 0 < alpha < math.inf:
        raise ValueError(f"lora_alpha={alpha!r} must be a finite number > 0.")
    if isinstance(targets, str) or not isinstance(targets, tuple | list):
        raise ValueError(f"lora_targets={targets!r} must be a tuple of names, e.g. ('q', 'v').")
    unknown = [t for t in targets if t not in LORA_TARGETS]
    if unknown:
        raise ValueError(
            f"lora_targets has {unknown}, not projections LoRA can adapt; choose among "
            f"{tuple(LORA_TARGETS)}."
        )


def _warn_if_larger_than_kernel(rank: int, fan_in: int, fan_out: int) -> None:
    """UserWarning when an adapter pair, `rank * (fan_in + fan_out)` parameters, is larger
    than the `fan_in * fan_out` kernel it adapts: LoRA then saves nothing over training the
    kernel. Not an error: the adapted model computes what it should (PEFT accepts such
    ranks too), it is only wasteful, and beyond `min(fan_in, fan_out)` the extra rank
    cannot even be used (rank(A @ B) <= min). Emitted while tracing (init, or the first
    call of a jitted function), once per message under Python's default filter."""
    adapter, kernel = rank * (fan_in + fan_out), fan_in * fan_out
    if adapter <= kernel:
        return
    useless = ""
    if rank > min(fan_in, fan_out):
        useless = (
            f", and A @ B has rank at most {min(fan_in, fan_out)}, so the rank beyond that "
            "adds parameters and nothing else"
        )
    warnings.warn(
        f"LoRA: lora_rank={rank} on a ({fan_in} -> {fan_out}) kernel makes an adapter of "
        f"{adapter:,} parameters, more than the {kernel:,} of the kernel it adapts{useless}; "
        f"an adapter is no larger than its kernel up to rank {kernel // (fan_in + fan_out)} "
        "(lower lora_rank, or fine-tune the kernel itself).",
        UserWarning,
        stacklevel=3,
    )


def adapt_kernel(
    kernel: jax.Array,
    names: tuple[str, ...],
    parts: str | tuple[str, ...],
    *,
    in_axes: int,
    rank: int,
    alpha: float,
    targets: tuple[str, ...],
    dtype: Any,
) -> jax.Array:
    """`kernel` in `dtype`, with the adapters of its targeted parts added (if any).

    Call it inside a compact method: the adapters are children of the calling module.

    Args:
      kernel: `(*in, *out)` for one projection (`parts` a str), or `(*in, P, *out)` for a
        fused one whose axis `in_axes` holds the P = len(parts) projections.
      names: the kernel's logical axis names.
      parts: the target name of the kernel ('q', 'o', 'up', ...) or of each fused part.
      in_axes: how many leading axes are the kernel's input.
      rank, alpha, targets: the layer's LoRA fields; rank 0 returns `kernel` cast.
      dtype: the compute dtype.
    """
    _check_fields(rank, alpha, targets)
    fused = not isinstance(parts, str)
    wanted = [p for p in (parts if fused else (parts,)) if p in targets]
    if rank == 0 or not wanted:
        return kernel.astype(dtype)
    in_shape, in_names = kernel.shape[:in_axes], names[:in_axes]
    out_at = in_axes + 1 if fused else in_axes
    out_shape, out_names = kernel.shape[out_at:], names[out_at:]

    _warn_if_larger_than_kernel(rank, math.prod(in_shape), math.prod(out_shape))

    def delta(part: str) -> jax.Array:
        if part not in wanted:
            return jnp.zeros((*in_shape, *out_shape), LORA_DTYPE)
        adapter = LoRA(rank, alpha, in_names, out_names, name=f"lora_{part}")
        return adapter(in_shape, out_shape)

    update = jnp.stack([delta(p) for p in parts], axis=in_axes) if fused else delta(parts)
    return (kernel.astype(LORA_DTYPE) + update).astype(dtype)
