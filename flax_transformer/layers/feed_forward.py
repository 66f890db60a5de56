"""FeedForward module around `functional.feed_forward`."""

from __future__ import annotations

from typing import Any

import chex
import jax
import jax.numpy as jnp
from flax import linen as nn

from flax_transformer import axes
from flax_transformer.functional import feed_forward
from flax_transformer.layers.initializers import INIT_STD, partitioned, zeros_init

ACTIVATIONS = {
    "relu": jax.nn.relu,
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
    "gelu_tanh": lambda x: jax.nn.gelu(x, approximate=True),  # GPT-2's "gelu_new"
}


class FeedForward(nn.Module):
    """Position-wise MLP `D -> F -> D` (seed 000: FFN).

    Attributes:
      d_ff: hidden width F.
      activation: 'relu', 'gelu' or 'gelu_tanh'.
      use_bias: learn biases b1, b2.
      init_std: standard deviation of the normal kernel init (INIT_STD = 0.02, seed 000).
      dtype, param_dtype: compute and storage dtypes.
    """

    d_ff: int
    activation: str = "relu"
    use_bias: bool = True
    init_std: float = INIT_STD
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x_BTD: jax.Array) -> jax.Array:
        """x `(..., D)` -> `(..., D)`."""
        width = x_BTD.shape[-1]
        w1 = self.param(
            "wi_kernel",
            partitioned(nn.initializers.normal(self.init_std), (axes.EMBED, axes.MLP)),
            (width, self.d_ff),
            self.param_dtype,
        )
        w2 = self.param(
            "wo_kernel",
            partitioned(nn.initializers.normal(self.init_std), (axes.MLP, axes.EMBED)),
            (self.d_ff, width),
            self.param_dtype,
        )
        b1 = b2 = None
        if self.use_bias:
            b1 = self.param(
                "wi_bias", partitioned(zeros_init, (axes.MLP,)), (self.d_ff,), self.param_dtype
            ).astype(self.dtype)
            b2 = self.param(
                "wo_bias", partitioned(zeros_init, (axes.EMBED,)), (width,), self.param_dtype
            ).astype(self.dtype)
        y = feed_forward(
            x_BTD.astype(self.dtype),
            w1.astype(self.dtype),
            b1,
            w2.astype(self.dtype),
            b2,
            ACTIVATIONS[self.activation],
        )
        chex.assert_equal_shape([y, x_BTD])
        return y
