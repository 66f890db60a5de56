"""LayerNorm and RMSNorm modules around `functional.layer_norm` and `functional.rms_norm`."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import linen as nn

from flax_transformer import axes
from flax_transformer.checks.arguments import as_features
from flax_transformer.functional import LAYER_NORM_EPS, RMS_NORM_EPS, layer_norm, rms_norm
from flax_transformer.layers.initializers import ones_init, partitioned, zeros_init


class LayerNorm(nn.Module):
    """Layer normalisation over the last axis with a learned gain and shift.

    Attributes:
      epsilon: the constant added to the variance.
      eps_inside_sqrt: True for `(x-mean)/sqrt(var+eps)` (standard); False for the notes'
        `(x-mean)/(std+eps)`.
      use_bias: learn the shift (GPT-2 and torch do).
      dtype: output dtype (statistics in float32, float64 for float64 inputs); None keeps
        the input's.
      param_dtype: storage dtype of scale and bias.
    """

    epsilon: float = LAYER_NORM_EPS
    eps_inside_sqrt: bool = True
    use_bias: bool = True
    dtype: Any = None
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        """x `(..., D)` -> `(..., D)`."""
        x = as_features("LayerNorm", "x", x)
        width = x.shape[-1]
        scale = self.param(
            "scale", partitioned(ones_init, (axes.EMBED,)), (width,), self.param_dtype
        )
        bias = None
        if self.use_bias:
            bias = self.param(
                "bias", partitioned(zeros_init, (axes.EMBED,)), (width,), self.param_dtype
            )
        y = layer_norm(x, scale, bias, self.epsilon, eps_inside_sqrt=self.eps_inside_sqrt)
        return y.astype(self.dtype or x.dtype)


class RMSNorm(nn.Module):
    """Root-mean-square normalisation over the last axis with a learned gain (Llama).

    Attributes:
      epsilon: the constant added to the mean square.
      dtype: output dtype (statistics in float32, float64 for float64 inputs); None keeps
        the input's.
      param_dtype: storage dtype of the scale.
    """

    epsilon: float = RMS_NORM_EPS
    dtype: Any = None
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        """x `(..., D)` -> `(..., D)`."""
        x = as_features("RMSNorm", "x", x)
        scale = self.param(
            "scale", partitioned(ones_init, (axes.EMBED,)), (x.shape[-1],), self.param_dtype
        )
        return rms_norm(x, scale, self.epsilon).astype(self.dtype or x.dtype)
