"""FeedForward module around `functional.feed_forward`."""

from __future__ import annotations

from typing import Any

import chex
import jax
import jax.numpy as jnp
from flax import linen as nn

from flax_transformer import axes
from flax_transformer.config import DEFAULT_LORA_ALPHA, DEFAULT_LORA_TARGETS
from flax_transformer.functional import (
    feed_forward,
    gated_feed_forward,
    gelu,
    gelu_tanh,
    relu_squared,
)
from flax_transformer.layers.initializers import INIT_STD, partitioned, zeros_init
from flax_transformer.layers.lora import adapt_kernel

# The LoRA target name of each kernel (`TransformerConfig.lora_targets`).
_LORA_TARGET = {"wi_kernel": "up", "wg_kernel": "gate", "wo_kernel": "down"}

ACTIVATIONS = {
    "relu": jax.nn.relu,
    "gelu": gelu,  # exact, in the erf form (functional.gelu)
    "gelu_tanh": gelu_tanh,  # GPT-2's "gelu_new" (jax.nn.gelu's tanh approximation)
    "relu2": relu_squared,  # max(0, x)**2 (Primer; the modded-nanogpt speedrun)
}


# Gated variants (Shazeer 2020): the activation applied to the gate projection.
GATED_ACTIVATIONS = {
    "swiglu": jax.nn.silu,  # Llama, Mistral, Qwen2
    "geglu": gelu,
}


class FeedForward(nn.Module):
    """Position-wise MLP `D -> F -> D` (the paper §3.3: FFN), or its gated variant.

    With activation 'swiglu' or 'geglu' it is `(act(x Wg) * (x Wu)) Wd`
    (`functional.gated_feed_forward`): three kernels `wg_kernel`, `wi_kernel` (up) and
    `wo_kernel` (down) instead of two; F is the hidden width of both.

    Attributes:
      d_ff: hidden width F.
      activation: 'relu', 'gelu', 'gelu_tanh', 'relu2' (ReLU squared), or gated: 'swiglu',
        'geglu'.
      use_bias: learn biases (b1, b2; gated: bg, bu, bd).
      init_std: standard deviation of the normal kernel init (INIT_STD = 0.02, as GPT-2).
      dtype, param_dtype: compute and storage dtypes.
      lora_rank, lora_alpha, lora_targets: LoRA adapters (`layers.lora`; rank 0 = none) on
        the targeted kernels among 'up' (`wi_kernel`), 'gate' (`wg_kernel`) and 'down'
        (`wo_kernel`), as children `lora_up`, `lora_gate`, `lora_down` with params
        `lora_a`, `lora_b` (attention names 'q', 'k', 'v', 'o' are ignored here).
    """

    d_ff: int
    activation: str = "relu"
    use_bias: bool = True
    init_std: float = INIT_STD
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32
    lora_rank: int = 0
    lora_alpha: float = DEFAULT_LORA_ALPHA
    lora_targets: tuple[str, ...] = DEFAULT_LORA_TARGETS

    def _kernel(self, name: str, shape: tuple[int, int], names: tuple[str, str]) -> jax.Array:
        init = partitioned(nn.initializers.normal(self.init_std), names)
        kernel = self.param(name, init, shape, self.param_dtype)
        return adapt_kernel(
            kernel,
            names,
            _LORA_TARGET[name],
            in_axes=1,
            rank=self.lora_rank,
            alpha=self.lora_alpha,
            targets=self.lora_targets,
            dtype=self.dtype,
        )

    def _bias(self, name: str, size: int, axis: str) -> jax.Array:
        init = partitioned(zeros_init, (axis,))
        return self.param(name, init, (size,), self.param_dtype).astype(self.dtype)

    def _gated(self, x_BTD: jax.Array) -> jax.Array:
        width = x_BTD.shape[-1]
        wg = self._kernel("wg_kernel", (width, self.d_ff), (axes.EMBED, axes.MLP))
        wu = self._kernel("wi_kernel", (width, self.d_ff), (axes.EMBED, axes.MLP))
        wd = self._kernel("wo_kernel", (self.d_ff, width), (axes.MLP, axes.EMBED))
        biases = None
        if self.use_bias:
            biases = (
                self._bias("wg_bias", self.d_ff, axes.MLP),
                self._bias("wi_bias", self.d_ff, axes.MLP),
                self._bias("wo_bias", width, axes.EMBED),
            )
        return gated_feed_forward(
            x_BTD.astype(self.dtype), wg, wu, wd, GATED_ACTIVATIONS[self.activation], biases
        )

    @nn.compact
    def __call__(self, x_BTD: jax.Array) -> jax.Array:
        """x `(..., D)` -> `(..., D)`."""
        if self.activation in GATED_ACTIVATIONS:
            y = self._gated(x_BTD)
            chex.assert_equal_shape([y, x_BTD])
            return y
        if self.activation not in ACTIVATIONS:
            raise ValueError(
                f"FeedForward.activation={self.activation!r} is not one of "
                f"{sorted(ACTIVATIONS) + sorted(GATED_ACTIVATIONS)}."
            )
        width = x_BTD.shape[-1]
        w1 = self._kernel("wi_kernel", (width, self.d_ff), (axes.EMBED, axes.MLP))
        w2 = self._kernel("wo_kernel", (self.d_ff, width), (axes.MLP, axes.EMBED))
        b1 = b2 = None
        if self.use_bias:
            b1 = self._bias("wi_bias", self.d_ff, axes.MLP)
            b2 = self._bias("wo_bias", width, axes.EMBED)
        y = feed_forward(x_BTD.astype(self.dtype), w1, b1, w2, b2, ACTIVATIONS[self.activation])
        chex.assert_equal_shape([y, x_BTD])
        return y
