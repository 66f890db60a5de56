"""Checks of traced values: `runtime_check` stages them, `checked(fn)` raises them.

Under `jax.jit` the values of token ids, positions, cache indices and prompt lengths are
tracers, so the models cannot check them in Python. With `TransformerConfig(debug_checks=
True)` they stage those checks into the program as `jax.experimental.checkify` checks;
`checked` functionalizes them (`checkify.checkify`), jits the result, and raises the first
failed check as a `jax.experimental.checkify.JaxRuntimeError` (a `ValueError`)
naming the value, after the call.

    model = Transformer(config.replace(debug_checks=True))
    apply = checked(model.apply)
    logits = apply(variables, src, tgt)  # raises for an id outside [0, V), under jit

`generate_translation` / `generate_text` do this themselves for such a model.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import re
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import checkify

# Set while `checked` (or generation with debug_checks) traces a function it functionalizes.
_FUNCTIONALIZING = contextvars.ContextVar("flax_transformer_functionalizing", default=False)

# What `runtime_check` says when an enabled check is staged where nothing functionalizes it.
UNFUNCTIONALIZED = (
    "TransformerConfig.debug_checks=True stages checks of traced values (token ids, "
    "positions, cache room, prompt lengths) into the program, and plain jax.jit cannot run "
    "them (jax would fail later with 'a checkify.check which was not functionalized'): jit "
    "the function with flax_transformer.checked(fn) instead of jax.jit(fn); it can wrap a "
    "whole step, e.g. checked(jax.value_and_grad(loss_fn))(params, batch), or your own "
    "jax.jit(jax.experimental.checkify.checkify(fn)). Or build the model with "
    "debug_checks=False to trace it unchecked. (The check staged here: {message})"
)


@contextlib.contextmanager
def functionalizing() -> Iterator[None]:
    """Mark the code traced inside as functionalized by checkify (`checked`, generation)."""
    token = _FUNCTIONALIZING.set(True)
    try:
        yield
    finally:
        _FUNCTIONALIZING.reset(token)


def _traces(x: Any) -> Iterator[Any]:
    """The traces `x` is being traced by, innermost first (none for a concrete array).

    jax's tracers carry their trace, and each trace its parent; private attributes, read
    with getattr so that a jax without them yields nothing (and `runtime_check` then
    leaves the error to jax, as before).
    """
    trace = getattr(x, "_trace", None)
    while trace is not None:
        yield trace
        trace = getattr(trace, "parent_trace", None)


def _staged_unfunctionalized(predicate: Any) -> bool:
    """Whether a check on `predicate` would be staged (jit, scan) with no checkify around.

    Eager calls, eager `vmap` and eager `grad` run a check at once: nothing is staged.
    """
    # jax's flag that runs unfunctionalized checks as host callbacks (CPU and GPU only).
    runtime_errors = getattr(jax.config, "jax_experimental_unsafe_xla_runtime_errors", False)
    if _FUNCTIONALIZING.get() or runtime_errors:
        return False
    staged = False
    for trace in _traces(predicate):
        debug_info = getattr(getattr(trace, "frame", None), "debug_info", None)
        if getattr(debug_info, "traced_for", None) == "checkify":
            return False  # the caller's own checkify.checkify
        staged = staged or type(trace).__name__ == "DynamicJaxprTrace"
    return staged


def runtime_check(enabled: bool, predicate: jax.Array, message: str, **values: Any) -> None:
    """Check a condition on traced values: a `checkify` check when `enabled`, else nothing.

    `message` is formatted with `values` by checkify (`{name}` fields) when the check fails.
    Run the enclosing jitted function through `flax_transformer.checked` (or
    `jax.jit(jax.experimental.checkify.checkify(fn))`) to get the error raised.

    Raises:
      ValueError: `enabled` and the check is being staged (under `jax.jit`, `lax.scan`)
        with neither around it: jax itself would refuse it only when lowering, with an
        error that does not name `checked`.
    """
    if not enabled:
        return
    predicate = jnp.all(predicate)
    if _staged_unfunctionalized(predicate):
        unfilled = re.sub(r"\{\w+\}", "...", message)  # checkify fills {low}, {high}
        raise ValueError(UNFUNCTIONALIZED.format(message=unfilled))
    checkify.check(predicate, message, **values)


def _static(value: Any) -> bool:
    """Python values that select a program rather than feed it (`deterministic=True`,
    `method='extend'`, `mutable=['intermediates']`): bound before tracing."""
    if value is None or isinstance(value, bool | int | float | str):
        return True
    if isinstance(value, list | tuple):
        return all(isinstance(v, str) for v in value)
    return callable(value) and not isinstance(value, jax.Array)


def _key(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def checked(fn: Callable) -> Callable:
    """`fn` jitted with its checkify checks raised (see the module docstring).

    Keyword arguments that are Python values (bools, ints, floats, strings, lists of
    strings, functions) are bound before tracing, so `deterministic=True` or
    `method="extend"` work as with an unjitted `model.apply`; a new combination of them
    compiles once. Positional arguments and other keywords (arrays, pytrees of arrays such
    as `rngs={"dropout": key}`) are traced. Pass the unjitted function: a function already
    wrapped in `jax.jit` would trace its keyword arguments.

    Returns:
      A function with `fn`'s signature that raises `checkify.JaxRuntimeError` (a
      `ValueError`) when a check fails, and otherwise returns `fn`'s result.
    """
    compiled: dict = {}

    @functools.wraps(fn)
    def run(*args, **kwargs):
        static = {k: v for k, v in kwargs.items() if _static(v)}
        dynamic = {k: v for k, v in kwargs.items() if k not in static}
        key = tuple(sorted((k, _key(v)) for k, v in static.items()))
        if key not in compiled:
            bound = functools.partial(fn, **static)
            compiled[key] = jax.jit(checkify.checkify(bound, errors=checkify.user_checks))
        with functionalizing():  # a first call traces fn here
            err, out = compiled[key](*args, **dynamic)
        err.throw()
        return out

    return run
