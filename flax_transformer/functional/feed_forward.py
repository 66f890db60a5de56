"""Position-wise feed-forward network (Vaswani et al. 2017, §3.3: FFN(x) = max(0, x W1 + b1) W2
+ b2; Happy-LLM ch. 2)."""

from __future__ import annotations

from collections.abc import Callable

import jax

from flax_transformer.functional.projection import project


def feed_forward(
    x_TD: jax.Array,
    w1_DF: jax.Array,
    b1_F: jax.Array | None,
    w2_FD: jax.Array,
    b2_D: jax.Array | None,
    activation: Callable[[jax.Array], jax.Array] = jax.nn.relu,
) -> jax.Array:
    """Apply the same two-layer MLP to every position.

    Args:
      x_TD: inputs `(..., D)`.
      w1_DF, b1_F: first layer `(D, F)`, `(F,)` (bias may be None).
      w2_FD, b2_D: second layer `(F, D)`, `(D,)` (bias may be None).
      activation: the nonlinearity between them (ReLU in the paper; GELU in GPT-2).

    Returns:
      `(..., D)`.
    """
    h = project(x_TD, w1_DF)
    if b1_F is not None:
        h = h + b1_F
    h = activation(h)
    y = project(h, w2_FD)
    if b2_D is not None:
        y = y + b2_D
    return y


def gated_feed_forward(
    x_TD: jax.Array,
    wg_DF: jax.Array,
    wu_DF: jax.Array,
    wd_FD: jax.Array,
    activation: Callable[[jax.Array], jax.Array] = jax.nn.silu,
    biases: tuple[jax.Array, jax.Array, jax.Array] | None = None,
) -> jax.Array:
    """Gated linear unit feed-forward (Shazeer 2020, "GLU Variants Improve Transformer"):

        FFN(x) = (activation(x Wg) * (x Wu)) Wd

    SwiGLU (Llama) uses SiLU as the activation, GEGLU uses GELU.

    Args:
      x_TD: inputs `(..., D)`.
      wg_DF: gate projection `(D, F)`.
      wu_DF: up projection `(D, F)`.
      wd_FD: down projection `(F, D)`.
      activation: applied to the gate.
      biases: `(bg (F,), bu (F,), bd (D,))`, or None for none (Llama has none).

    Returns:
      `(..., D)`.
    """
    gate = project(x_TD, wg_DF)
    up = project(x_TD, wu_DF)
    if biases is not None:
        gate, up = gate + biases[0], up + biases[1]
    y = project(activation(gate) * up, wd_FD)
    if biases is not None:
        y = y + biases[2]
    return y
