"""One interface over both models, with and without the KV cache, for the decoding loops.

A `Stepper` hides what a model needs to produce the next-token logits of every sequence:
`start()` reads the prompts and returns their last logits and a state; `step(state, tokens)`
appends one token per sequence and returns the next logits; `reorder(state, rows)` keeps
(and copies) the sequences `rows`, as beam search needs; `move(state, rows)` does the same
for a same-size reorder whose source rows keep their contents, which the cache does in
place, copying only the rows that change (`cache.move_rows`). The state is a pytree, so the
loops carry it through `jax.lax.while_loop`.

With the cache the state is the cache of `flax_transformer.cache`: one parallel prefill, then one
token per step. Without it (`use_cache=False`, the reference) the state is a fixed-size
token buffer and every step runs the full model over the whole buffer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from flax_transformer.cache import init_cache, move_rows, select_rows
from flax_transformer.checks.traced import runtime_check


class Stepper(NamedTuple):
    """Next-token logits of a batch of sequences, one token at a time (see module docstring).

    Attributes:
      start: `() -> (logits (B, V) float32, state)`.
      step: `(state, tokens (B,) int32) -> (logits (B, V) float32, state)`.
      reorder: `(state, rows (R,) int) -> state` of the R sequences `rows`.
      move: `reorder` for R rows in, R rows out, where `rows[rows[r]] == rows[r]` (every
        source row keeps its contents); the beam search loop's reorder.
    """

    start: Callable[[], tuple[jax.Array, Any]]
    step: Callable[[Any, jax.Array], tuple[jax.Array, Any]]
    reorder: Callable[[Any, jax.Array], Any]
    move: Callable[[Any, jax.Array], Any]


def _last_logits(logits_BTV: jax.Array, lengths_B: jax.Array) -> jax.Array:
    """Row `lengths_B[b] - 1` of each sequence's logits: the prediction of its next token.

    A length outside [1, T] (only possible unchecked under `jit`) gives NaN logits, not
    the wrap-around of row -1.
    """
    valid_B = (lengths_B >= 1) & (lengths_B <= logits_BTV.shape[1])
    safe_B = jnp.where(valid_B, lengths_B, 1)
    last_BV = jnp.take_along_axis(logits_BTV, (safe_B - 1)[:, None, None], axis=1)[:, 0]
    return jnp.where(valid_B[:, None], last_BV, jnp.nan)


def _cached_step(model, params) -> Callable:
    def step(cache, tokens_B):
        logits_B1V, cache = model.apply(params, tokens_B[:, None], cache, method="extend")
        return logits_B1V[:, 0], cache

    return step


def _uncached(full_logits: Callable, extra: Any, buffer_BL: jax.Array, lengths_B: jax.Array):
    """A Stepper that recomputes `full_logits(extra, buffer)` over the whole buffer each step.

    The buffer holds each sequence's tokens so far, then padding; the models mask padding
    and are causal, so the logits at `lengths - 1` are those of the unpadded sequence.
    """

    def start():
        return _last_logits(full_logits(extra, buffer_BL), lengths_B), (extra, buffer_BL, lengths_B)

    def step(state, tokens_B):
        extra, buffer_BL, lengths_B = state
        buffer_BL = buffer_BL.at[jnp.arange(buffer_BL.shape[0]), lengths_B].set(tokens_B)
        lengths_B = lengths_B + 1
        return _last_logits(full_logits(extra, buffer_BL), lengths_B), (extra, buffer_BL, lengths_B)

    def reorder(state, rows_R):
        return jax.tree.map(lambda x: jnp.take(x, rows_R, axis=0), state)

    return Stepper(start, step, reorder, reorder)


def text_stepper(
    model, params, prompt_BP: jax.Array, lengths_B: jax.Array, max_new_tokens: int, use_cache: bool
) -> Stepper:
    """Stepper of a `DecoderOnlyTransformer` continuing right-padded prompts.

    Args:
      model, params: the model and its (unboxed) variables.
      prompt_BP: int32 prompts `(B, P)`; entries at or past `lengths_B[b]` are ignored.
      lengths_B: int32 `(B,)`, real prompt lengths, each in [1, P].
      max_new_tokens: N; the cache (or buffer) holds P + N tokens.
      use_cache: KV cache with parallel prefill, or full recomputation.
    """
    cfg = model.config
    batch, prompt_len = prompt_BP.shape
    length = prompt_len + max_new_tokens
    runtime_check(
        cfg.debug_checks,
        (lengths_B >= 1) & (lengths_B <= prompt_len),
        f"prompt_lengths hold [{{low}}, {{high}}]; each must lie in [1, P={prompt_len}]: every "
        "prompt needs at least one token.",
        low=jnp.min(lengths_B),
        high=jnp.max(lengths_B),
    )
    real_BP = jnp.arange(prompt_len)[None, :] < lengths_B[:, None]
    prompt_BP = jnp.where(real_BP, prompt_BP, cfg.pad_id)
    if not use_cache:
        buffer_BL = (
            jnp.full((batch, length), cfg.pad_id, jnp.int32).at[:, :prompt_len].set(prompt_BP)
        )
        return _uncached(lambda _, tokens: model.apply(params, tokens), None, buffer_BL, lengths_B)

    def start():
        cache = init_cache(cfg, batch, length)
        logits_BPV, cache = model.apply(
            params, prompt_BP, cache, lengths_B=lengths_B, method="extend"
        )
        return _last_logits(logits_BPV, lengths_B), cache

    return Stepper(start, _cached_step(model, params), select_rows, move_rows)


def translation_stepper(
    model, params, src_BS: jax.Array, bos_id: int, max_new_tokens: int, use_cache: bool
) -> Stepper:
    """Stepper of a `Transformer` translating `src_BS` `(B, S)`, starting from BOS.

    With the cache the encoder runs once (in `start`), and each decoder layer's
    cross-attention keys/values are computed once and cached; without it every step runs
    the full model, encoder included.
    """
    cfg = model.config
    batch, source_len = src_BS.shape
    length = 1 + max_new_tokens
    ones_B = jnp.ones((batch,), jnp.int32)
    if not use_cache:
        buffer_BL = jnp.full((batch, length), cfg.pad_id, jnp.int32).at[:, 0].set(bos_id)
        return _uncached(lambda src, tgt: model.apply(params, src, tgt), src_BS, buffer_BL, ones_B)

    def start():
        cache = init_cache(cfg, batch, length, source_len)
        bos_B1 = jnp.full((batch, 1), bos_id, jnp.int32)
        logits_B1V, cache = model.apply(params, src_BS, bos_B1, cache, method="prefill")
        return logits_B1V[:, 0], cache

    return Stepper(start, _cached_step(model, params), select_rows, move_rows)
