"""Position-wise feed-forward network (Vaswani et al. 2017, §3.3: FFN(x) = max(0, x W1 + b1) W2
+ b2; Happy-LLM ch. 2)."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from flax_transformer.checks.arguments import (
    as_array,
    as_features,
    check_floating,
    check_param_width,
)
from flax_transformer.functional.projection import project


def _arrays(fn: str, **arrays) -> tuple:
    """The arguments as arrays (nested lists converted, `as_array`), None kept."""
    return tuple(None if a is None else as_array(fn, name, a) for name, a in arrays.items())


def _check_kernels(fn: str, x, w_in, w_out, names: tuple[str, str], biases: dict) -> None:
    """x `(..., D)` floating, `w_in` `(D, F)`, `w_out` `(F, D)`, each bias `(its width,)`."""
    check_floating(fn, "x_TD", x)
    x_shape, in_shape, out_shape = jnp.shape(x), jnp.shape(w_in), jnp.shape(w_out)
    width = x_shape[-1] if x_shape else None
    ok = (
        len(in_shape) == 2
        and len(out_shape) == 2
        and in_shape[0] == width
        and out_shape == (in_shape[1], width)
    )
    if not ok:
        raise ValueError(
            f"{fn}: x_TD {x_shape}, {names[0]} {in_shape}, {names[1]} {out_shape}: the kernels "
            f"must be 2-D, (D, F) then (F, D), with D = x's last axis ({width})."
        )
    for name, (b, size) in biases.items():
        check_param_width(fn, name, b, size)


def _common_dtype(*arrays) -> jnp.dtype:
    """The dtype the arguments promote to (None skipped): the products' compute dtype and
    the result's, as plain jnp arithmetic on them would give."""
    return jnp.result_type(*(a for a in arrays if a is not None))


# 1 / sqrt(2), the argument scale of erf in Phi(x) = (1 + erf(x / sqrt 2)) / 2.
_SQRT_HALF = 0.7071067811865476


def _computed_in_float32(fn: Callable[[jax.Array], jax.Array], x) -> jax.Array:
    """`fn(x)` computed in float32 (or wider, for float64) and rounded once to x's dtype.

    The GELUs are `x/2 * (1 + f(x))` with f -> -1 as x -> -inf: in bfloat16 (8 significant
    bits) `1 + f(x)` keeps only a few correct bits where GELU is small and negative (18%
    off at x = -2.58), in float16 3%. Computed in float32 and rounded once, the result is
    within the dtype's unit roundoff (torch computes its bfloat16 GELU the same way).
    float32 inputs run `fn` as it is.
    """
    x = jnp.asarray(x)
    wide = jnp.promote_types(x.dtype, jnp.float32)
    if wide == x.dtype:
        return fn(x)
    return fn(x.astype(wide)).astype(x.dtype)


def _gelu_erf(x: jax.Array) -> jax.Array:
    half = jnp.asarray(0.5, x.dtype)
    return half * x * (1 + jax.lax.erf(x * jnp.asarray(_SQRT_HALF, x.dtype)))


def gelu(x: jax.Array) -> jax.Array:
    """Exact GELU, `x * Phi(x) = x/2 * (1 + erf(x / sqrt 2))` (Hendrycks & Gimpel 2016, eq. 1).

    The same function as `jax.nn.gelu(x, approximate=False)`, written with `erf` as torch's
    `F.gelu` is: XLA lowers `jax.nn.gelu`'s `erfc` to a range-split polynomial, and on a CPU
    this form's forward is 2.6x faster, its value and gradient 1.14x
    (`benchmarks/elementwise.py`), at the same float32 accuracy (within 1e-6 of the float64
    value and derivative; `tests/test_functional.py`).

    bfloat16 and float16 inputs are computed in float32 and rounded once (value and
    gradient): within the dtype's unit roundoff of the exact value (0.39% in bfloat16)
    where `1 + erf` in the narrow dtype would cancel (18% in bfloat16). In float32 the
    negative tail (x < -3, |gelu| < 4e-3) keeps an absolute error under 1e-6, relatively
    large where |gelu| < 1e-6, as torch's float32 `F.gelu`; `jax.nn.gelu`'s `erfc` form is
    accurate there, at its cost.
    """
    return _computed_in_float32(_gelu_erf, x)


def gelu_tanh(x: jax.Array) -> jax.Array:
    """GELU's tanh approximation, `jax.nn.gelu(x, approximate=True)` (GPT-2's "gelu_new"),
    computed in float32 for bfloat16 and float16 inputs and rounded once, as `gelu`."""
    return _computed_in_float32(lambda x: jax.nn.gelu(x, approximate=True), x)


def relu_squared(x: jax.Array) -> jax.Array:
    """ReLU squared, `max(0, x) ** 2` (So et al. 2021, "Primer", section 3; the feed-forward
    nonlinearity of the modded-nanogpt speedrun): the activation 'relu2' of the layers.

    Its derivative, `2 max(0, x)`, is continuous, unlike ReLU's.
    """
    x = jnp.asarray(x)
    return jnp.square(jax.nn.relu(x))


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
      `(..., D)` in the arguments' common dtype; the two products take their operands in
      it and sum in float32 (`functional.precision`), the activation runs on the float32
      sums.

    Raises:
      TypeError: x is not floating. ValueError: kernels or biases of the wrong shapes.
    """
    x_TD, w1_DF, b1_F, w2_FD, b2_D = _arrays(
        "feed_forward", x_TD=x_TD, w1_DF=w1_DF, b1_F=b1_F, w2_FD=w2_FD, b2_D=b2_D
    )
    x_TD = as_features("feed_forward", "x_TD", x_TD)
    hidden = jnp.shape(w1_DF)[-1] if jnp.ndim(w1_DF) else None  # a scalar: _check_kernels says
    _check_kernels(
        "feed_forward",
        x_TD,
        w1_DF,
        w2_FD,
        ("w1_DF", "w2_FD"),
        {"b1_F": (b1_F, hidden), "b2_D": (b2_D, jnp.shape(x_TD)[-1])},
    )
    # Products in the arguments' common dtype summed in float32 (`functional.precision`);
    # the bias and the activation run on the float32 sums, rounded once before the next
    # product and at the end.
    dtype = _common_dtype(x_TD, w1_DF, b1_F, w2_FD, b2_D)
    h = project(x_TD.astype(dtype), w1_DF.astype(dtype))
    if b1_F is not None:
        h = h + b1_F
    h = activation(h).astype(dtype)
    y = project(h, w2_FD.astype(dtype))
    if b2_D is not None:
        y = y + b2_D
    return y.astype(dtype)


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
      `(..., D)` in the arguments' common dtype, the products as in `feed_forward`.

    Raises:
      TypeError: x is not floating. ValueError: kernels or biases of the wrong shapes.
    """
    fn = "gated_feed_forward"
    x_TD, wg_DF, wu_DF, wd_FD = _arrays(fn, x_TD=x_TD, wg_DF=wg_DF, wu_DF=wu_DF, wd_FD=wd_FD)
    x_TD = as_features(fn, "x_TD", x_TD)
    if jnp.shape(wg_DF) != jnp.shape(wu_DF):
        raise ValueError(
            f"gated_feed_forward: wg_DF {jnp.shape(wg_DF)} and wu_DF {jnp.shape(wu_DF)} must "
            "both be (D, F)."
        )
    if biases is not None and len(biases) != 3:
        raise ValueError("gated_feed_forward: biases must be (bg (F,), bu (F,), bd (D,)) or None.")
    bg, bu, bd = (
        (None, None, None)
        if biases is None
        else _arrays(fn, bg=biases[0], bu=biases[1], bd=biases[2])
    )
    hidden, width = jnp.shape(wg_DF)[-1], jnp.shape(x_TD)[-1]
    _check_kernels(
        "gated_feed_forward",
        x_TD,
        wg_DF,
        wd_FD,
        ("wg_DF", "wd_FD"),
        {"bg": (bg, hidden), "bu": (bu, hidden), "bd": (bd, width)},
    )
    # As in `feed_forward`: products in the common dtype summed in float32, gate and up
    # combined on the float32 sums and rounded once before the down projection.
    dtype = _common_dtype(x_TD, wg_DF, wu_DF, wd_FD, bg, bu, bd)
    x_TD = x_TD.astype(dtype)
    gate = project(x_TD, wg_DF.astype(dtype))
    up = project(x_TD, wu_DF.astype(dtype))
    if biases is not None:
        gate, up = gate + bg, up + bu
    y = project((activation(gate) * up).astype(dtype), wd_FD.astype(dtype))
    if biases is not None:
        y = y + bd
    return y.astype(dtype)
