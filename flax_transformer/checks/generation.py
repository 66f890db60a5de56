"""Input checks of the generation functions (and `unbox_params`, the variables check shared
with `train/`): a ValueError naming the fix, before any compute."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from flax_transformer.checks.arguments import is_concrete, is_int


def unbox_params(params: Any, required: tuple[str, ...], fn: str) -> dict:
    """`{'params': ...}` with plain arrays, from boxed or unboxed variables or a bare tree."""
    if not isinstance(params, Mapping):
        raise ValueError(
            f"{fn} needs params as returned by model.init (a dict with 'params'), got "
            f"{type(params).__name__}."
        )
    params = nn.unbox(params)
    if "params" not in params and all(name in params for name in required):
        params = {"params": params}
    tree = params.get("params")
    missing = [name for name in required if not isinstance(tree, Mapping) or name not in tree]
    if missing:
        have = sorted(tree) if isinstance(tree, Mapping) else sorted(params)
        raise ValueError(
            f"{fn}: params lack {missing} (found {have}); pass the variables from model.init "
            "or a checkpoint of this model."
        )
    return dict(params)


def check_eos_and_length(fn: str, config, eos_id, max_new_tokens) -> None:
    """ValueError unless max_new_tokens is an int >= 1 and eos_id None or a real token id."""
    vocab = config.output_vocab_size
    if not is_int(max_new_tokens) or max_new_tokens < 1:
        raise ValueError(f"{fn}: max_new_tokens={max_new_tokens!r} must be an int >= 1.")
    if eos_id is not None and (not is_int(eos_id) or not 0 <= eos_id < vocab):
        raise ValueError(f"{fn}: eos_id={eos_id!r} must be a token id in [0, {vocab}).")
    if eos_id is not None and eos_id == config.pad_id:
        raise ValueError(f"{fn}: eos_id={eos_id} equals pad_id; EOS must be a real token.")


def check_rng(fn: str, rng: Any) -> None:
    """One PRNG key: a typed key of shape () (`jax.random.key`) or a legacy uint32 `(2,)`
    key (`jax.random.PRNGKey`); an int or a batch of keys fails here, not deep in jax."""
    shape, dtype = getattr(rng, "shape", None), getattr(rng, "dtype", None)
    typed = dtype is not None and jnp.issubdtype(dtype, jax.dtypes.prng_key)
    legacy = dtype == jnp.uint32 and shape == (2,)
    if (typed and shape == ()) or legacy:
        return
    got = f"{type(rng).__name__}" + (f" of shape {shape} and dtype {dtype}" if shape else "")
    raise ValueError(
        f"{fn}: rng must be one PRNG key such as jax.random.key(0), got {got}"
        + (
            "; split a batch of keys outside, or pass one key for the whole batch."
            if shape
            else "."
        )
    )


def check_logits_hook(fn: str, hook: Any) -> Any:
    """The hook itself: None or a callable `(logits, tokens, step) -> logits`."""
    if hook is not None and not callable(hook):
        raise ValueError(
            f"{fn}: logits_hook must be a function (logits, tokens, step) -> logits or None, "
            f"got {type(hook).__name__}."
        )
    return hook


def check_prompt_lengths(fn: str, prompt: jax.Array, prompt_lengths: Any, pad_id: int) -> jax.Array:
    """int32 `(B,)` lengths in [1, P], with no `pad_id` inside any prompt (None: all P)."""
    batch, prompt_len = prompt.shape
    if prompt_lengths is None:
        prompt_lengths = np.full((batch,), prompt_len)
    lengths = jnp.asarray(prompt_lengths)
    if lengths.shape != (batch,) or not jnp.issubdtype(lengths.dtype, jnp.integer):
        raise ValueError(
            f"{fn}: prompt_lengths must be ints of shape (B,)=({batch},), got "
            f"{lengths.shape=}, {lengths.dtype=}."
        )
    if is_concrete(lengths):
        values = np.asarray(lengths)
        if values.min() < 1 or values.max() > prompt_len:
            raise ValueError(
                f"{fn}: prompt_lengths={values.tolist()} must lie in [1, P={prompt_len}]; "
                "every prompt needs at least one token."
            )
        if is_concrete(prompt):
            real = np.arange(prompt_len)[None, :] < values[:, None]
            pads = np.argwhere(real & (np.asarray(prompt) == pad_id))
            if pads.size:
                raise ValueError(
                    f"{fn}: prompt_tokens holds pad_id={pad_id} at {tuple(pads[0].tolist())}, "
                    "inside its prompt_length; the model masks padding, so real tokens must "
                    "differ from it."
                )
    return lengths.astype(jnp.int32)
