"""Argument checks shared by the formulas and the modules: one clear error per bad input.

Every check here runs before any compute, on what is known at trace time (shapes, dtypes,
Python numbers). Values inside arrays are known only outside `jit`; inside it they are
tracers, and `checks.traced.runtime_check` turns a condition on them into a `checkify`
check when the caller asked for checks (`TransformerConfig.debug_checks`, run through
`flax_transformer.checked`), and into nothing otherwise.

Errors: `TypeError` for a wrong dtype or Python type, `ValueError` for a wrong shape or
value. Each message names the argument, what it got, and the fix.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

# The fix for the masks users bring from other libraries, quoted by every mask error:
# torch/Hugging Face additive masks (0 = attend, -inf or -1e9 = blocked) and 0/1 int masks.
MASK_CONVENTION = (
    "masks are boolean, True = may attend: for an additive float mask m (0 = attend, -inf or "
    "-1e9 = blocked) pass m == 0; for a 0/1 mask pass m.astype(bool); for a torch-style "
    "'True = masked' mask (np.triu(..., k=1)) pass ~m"
)


def is_concrete(*xs: Any) -> bool:
    """Whether every array is a concrete value (not a tracer under `jit`/`vmap`/`grad`)."""
    return not any(isinstance(x, jax.core.Tracer) for x in xs)


def as_array(fn: str, name: str, x: Any) -> Any:
    """`x` for a formula that reads its `.shape` and `.dtype`: jax and numpy arrays (and
    tracers) as they are; a Python number or a nested list or tuple of numbers converted as
    `jnp.asarray` converts it (so `[[1, 2]]` is an int32 `(1, 2)` array, `2.0` a float32
    scalar, which the caller's shape check then refuses by name); anything else, or a
    ragged list, a TypeError naming `name` (after `fn: `, where `fn` is given) and the fix."""
    if isinstance(x, jax.Array | np.ndarray | np.generic):
        return x
    where = f"{fn}: " if fn else ""
    if isinstance(x, numbers.Number | list | tuple):
        try:
            return jnp.asarray(x)
        except (TypeError, ValueError) as e:
            why = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise TypeError(
                f"{where}{name} is a {type(x).__name__} that is not a rectangular array of "
                f"numbers ({why}); pass a jnp or np array."
            ) from None
    raise TypeError(
        f"{where}{name} must be an array (a jnp or np array, or a nested list of numbers), "
        f"got {type(x).__name__}; pass jnp.asarray(...) of it."
    )


def as_features(fn: str, name: str, x: Any) -> Any:
    """`as_array(fn, name, x)`, or ValueError for a scalar: `(..., D)` needs a feature axis."""
    x = as_array(fn, name, x)
    if not x.ndim:
        raise ValueError(f"{fn}: {name} must have a feature axis (..., D), got a scalar.")
    return x


def check_floating(fn: str, name: str, x: jax.Array) -> None:
    """TypeError unless `x` has a floating dtype (the formulas compute in real numbers)."""
    dtype = jnp.asarray(x).dtype
    if not jnp.issubdtype(dtype, jnp.floating):
        raise TypeError(
            f"{fn}: {name} has dtype {dtype}; it must be a floating array (the result would "
            f"be cast back to {dtype} and truncated): pass {name}.astype(jnp.float32)."
        )


def check_bool_mask(fn: str, mask: Any, name: str = "mask") -> jax.Array:
    """The mask as a bool array, or TypeError naming the conversion for any other dtype."""
    mask = jnp.asarray(mask)
    if mask.dtype != jnp.bool_:
        raise TypeError(f"{fn}: {name} has dtype {mask.dtype}; {MASK_CONVENTION}.")
    return mask


def check_number(
    fn: str,
    name: str,
    value: Any,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
) -> float:
    """A finite real Python/numpy number within the bounds, or an error naming the range.

    Tracers pass unchecked (a traced scale or eps cannot be known at trace time). Bools and
    strings are refused: `True` is not a rate and `"0.1"` is not a number.
    """
    if isinstance(value, jax.core.Tracer):
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Real | jax.Array):
        raise TypeError(
            f"{fn}: {name}={value!r} must be a real number, got {type(value).__name__}."
        )
    if isinstance(value, jax.Array) and value.ndim:
        raise TypeError(f"{fn}: {name} must be a scalar, got an array of shape {value.shape}.")
    number = float(value)
    below = low is not None and (number <= low if low_open else number < low)
    above = high is not None and (number >= high if high_open else number > high)
    bounds = _bounds(low, high, low_open, high_open)
    if not math.isfinite(number):
        raise ValueError(f"{fn}: {name}={value!r} must be a finite number{bounds}.")
    if below or above:
        raise ValueError(f"{fn}: {name}={value!r} must be{bounds}.")
    return number


def _bounds(low, high, low_open: bool, high_open: bool) -> str:
    """' in [0, 1)', ' > 0', ' <= 1' or '' for the message of `check_number`."""
    if low is not None and high is not None:
        return f" in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    if low is not None:
        return f" {'>' if low_open else '>='} {low:g}"
    if high is not None:
        return f" {'<' if high_open else '<='} {high:g}"
    return ""


def check_int(
    fn: str, name: str, value: Any, low: int | None = None, what: str | None = None
) -> int:
    """A Python/numpy int (not a bool, not a float), at least `low`, as an int.

    The project's one int check: TypeError for another type (a bool included: `True` is
    not a count), ValueError for an int below `low`. `what` says the range and what its
    values mean (">= 0 (0: off)"); it defaults to ">= low".
    """
    if what is None and low is not None:
        what = f">= {low}"
    expected = f"must be an int {what}" if what else "must be an int"
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{fn}: {name}={value!r} {expected}, got {type(value).__name__}.")
    if low is not None and value < low:
        raise ValueError(f"{fn}: {name}={value!r} {expected}.")
    return int(value)


def check_param_width(fn: str, name: str, param: jax.Array | None, width: int) -> None:
    """ValueError unless a per-feature parameter (scale, bias) is `(width,)`."""
    if param is not None and jnp.shape(param) != (width,):
        raise ValueError(
            f"{fn}: {name} has shape {jnp.shape(param)}, but x has {width} features on its "
            f"last axis; pass a ({width},) {name} (or None)."
        )


def check_model_width(owner: str, name: str, x: jax.Array, d_model: int) -> None:
    """ValueError unless an activation `x` is `(B, T, d_model)` (what a layer or stack reads)."""
    if x.ndim != 3 or x.shape[-1] != d_model:
        raise ValueError(
            f"{owner} expects {name} of shape (B, T, d_model={d_model}), got shape {x.shape}; "
            "project the input to d_model or set d_model to its width."
        )


def is_int(value: Any) -> bool:
    """Whether `value` is a Python or numpy int, not a bool (a test, where `check_int` raises)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)
