"""`checked(fn)`: run a function jitted, with the models' value checks raised as errors.

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

import functools
from collections.abc import Callable
from typing import Any

import jax
from jax.experimental import checkify

from flax_transformer.functional.checks import functionalizing


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
