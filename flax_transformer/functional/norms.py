"""Layer normalisation (Ba et al. 2016; the paper §3.1; Happy-LLM ch. 2)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from flax_transformer.checks.arguments import (
    as_array,
    as_features,
    check_floating,
    check_number,
    check_param_width,
)


def stats_dtype(dtype) -> jnp.dtype:
    """The dtype norm statistics run in: float32 for float32/bfloat16/float16 inputs (as
    mixed-precision code does), float64 for float64 inputs (under `jax_enable_x64`), the
    rule `functional.attention.softmax_dtype` gives the softmax."""
    return jnp.promote_types(dtype, jnp.float32)


# torch.nn.LayerNorm's default epsilon, also the value of the 2017 reference implementations.
LAYER_NORM_EPS = 1e-5


def layer_norm(
    x: jax.Array,
    scale: jax.Array | None,
    bias: jax.Array | None,
    eps: float = LAYER_NORM_EPS,
    *,
    eps_inside_sqrt: bool = True,
) -> jax.Array:
    """Normalise the last axis to zero mean and unit variance, then scale and shift.

        y = (x - mean) / sqrt(var + eps) * scale + bias     (standard: torch, flax)
        y = (x - mean) / (std + eps) * scale + bias         (eps_inside_sqrt=False)

    The variance is the biased one (divide by D) in both forms. Happy-LLM ch. 2's LayerNorm
    code uses the second form with torch's unbiased std (divide by D - 1); that equals ours
    with `scale` and `eps` both multiplied by sqrt((D - 1) / D) (tests/test_worked_examples.py
    shows it).
    Statistics are computed in float32 for float32, bfloat16 and float16 inputs, in float64
    for float64 inputs (`stats_dtype`), and the result is cast back to `x.dtype`.

    Args:
      x: `(..., D)`.
      scale: `(D,)` gain, or None for 1.
      bias: `(D,)` shift, or None for 0.
      eps: the small constant that keeps the division finite; a finite number > 0.
      eps_inside_sqrt: which of the two forms above.

    Raises:
      TypeError: x is not floating (an int result would be truncated).
      ValueError: eps is not a finite number > 0, or scale/bias is not `(D,)`.
    """
    x, scale, bias = _check_norm_args("layer_norm", x, eps, scale=scale, bias=bias)
    dtype = stats_dtype(x.dtype)
    xs = x.astype(dtype)
    mean = jnp.mean(xs, axis=-1, keepdims=True)
    centred = xs - mean
    var = jnp.mean(jnp.square(centred), axis=-1, keepdims=True)
    if eps_inside_sqrt:
        y = centred * jax.lax.rsqrt(var + eps)
    else:
        y = centred / (jnp.sqrt(var) + eps)
    if scale is not None:
        y = y * scale.astype(dtype)
    if bias is not None:
        y = y + bias.astype(dtype)
    return y.astype(x.dtype)


# Llama's RMSNorm epsilon (its reference implementation and Hugging Face's default).
RMS_NORM_EPS = 1e-6


def rms_norm(x: jax.Array, scale: jax.Array | None, eps: float = RMS_NORM_EPS) -> jax.Array:
    """Root-mean-square normalisation (Zhang & Sennrich 2019), as in Llama:

        y = x / sqrt(mean(x^2) + eps) * scale

    LayerNorm without the centring and the shift: the mean is not subtracted, and there is no
    bias. Statistics are computed in float32 for float32, bfloat16 and float16 inputs, in
    float64 for float64 inputs (`stats_dtype`), and the result is cast back to `x.dtype`.

    Args:
      x: `(..., D)`.
      scale: `(D,)` gain, or None for 1.
      eps: added to the mean square; a finite number > 0.

    Returns:
      `(..., D)`.

    Raises:
      TypeError: x is not floating.
      ValueError: eps is not a finite number > 0, or scale is not `(D,)`.
    """
    x, scale = _check_norm_args("rms_norm", x, eps, scale=scale)
    dtype = stats_dtype(x.dtype)
    xs = x.astype(dtype)
    y = xs * jax.lax.rsqrt(jnp.mean(jnp.square(xs), axis=-1, keepdims=True) + eps)
    if scale is not None:
        y = y * scale.astype(dtype)
    return y.astype(x.dtype)


def _check_norm_args(fn: str, x: jax.Array, eps: float, **params: jax.Array | None) -> tuple:
    """The checks both norms share: a floating x of rank >= 1, eps > 0, `(D,)` parameters.

    Returns `(x, *params)` as arrays (nested lists converted, `as_array`), None kept."""
    x = as_features(fn, "x", x)
    check_floating(fn, "x", x)
    check_number(fn, "eps", eps, low=0.0, low_open=True)
    arrays = {name: None if p is None else as_array(fn, name, p) for name, p in params.items()}
    for name, param in arrays.items():
        check_param_width(fn, name, param, x.shape[-1])
    return (x, *arrays.values())
