"""Choosing the next token from logits: greedy, temperature, top-k and top-p (nucleus).

Pure jnp functions on float32 logits `(..., V)`. The strategies call them once per step
(`Greedy`: `argmax_first`; `Sample`: `filter_logits`, then a draw); `choose_tokens` does
either, for loops of your own.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

# Logit given to a token that may not be chosen. Finite (unlike -inf) so that sums and
# differences of scores never produce NaN, and far below any real logit: exp() of it
# underflows to exactly 0 in a softmax.
MASKED_LOGIT = -1e30


def mask_token(logits_BV: jax.Array, token_id: int) -> jax.Array:
    """Forbid one token (generation never emits padding, which the models mask as input)."""
    return logits_BV.at[..., token_id].set(MASKED_LOGIT)


def argmax_first(logits_BV: jax.Array) -> jax.Array:
    """int32 `(...)`: `jnp.argmax(logits_BV, axis=-1)` (first index of the maximum, or of the
    first NaN), computed as a max, then a min over the indices that reach it.

    The same result as `jnp.argmax`, faster on XLA's CPU backend, whose argmax is one
    reduction over (value, index) pairs that it does not vectorize: over 8000 logits 46 µs
    at batch 1 and 340 µs at batch 8, against 14 µs and 78 µs for the two plain reductions
    here (2026-11-30, 2-core AMD EPYC). Greedy decoding runs it once per step, so its
    cost is paid on every generated token.
    """
    vocab = logits_BV.shape[-1]
    top_B1 = logits_BV.max(axis=-1, keepdims=True)
    # max() propagates NaN, and argmax picks the first NaN: match NaNs too.
    hit_BV = (logits_BV == top_B1) | jnp.isnan(logits_BV)
    index_V = jnp.arange(vocab, dtype=jnp.int32)
    return jnp.min(jnp.where(hit_BV, index_V, vocab), axis=-1)


def top_k_mask(logits_BV: jax.Array, k: int) -> jax.Array:
    """bool `(..., V)`: the k largest logits of each row (ties with the k-th are kept too)."""
    if k < 1:
        raise ValueError(f"top_k_mask needs k >= 1, got {k}.")
    k = min(k, logits_BV.shape[-1])
    kth_B1 = jax.lax.top_k(logits_BV, k)[0][..., -1:]
    return logits_BV >= kth_B1


def top_p_mask(logits_BV: jax.Array, p: float | jax.Array) -> jax.Array:
    """bool `(..., V)`: the nucleus, the smallest set of tokens whose probability reaches p.

    Tokens are taken in order of decreasing probability while the mass taken so far is
    below p (Holtzman et al. 2019), so the most likely token is always kept. Ties are
    broken by token id. At p=1 float rounding decides whether zero-probability tokens are
    kept; callers skip the filter then.

    Args:
      logits_BV: float logits `(..., V)`.
      p: the mass to reach, in (0, 1].
    """
    probs_BV = jax.nn.softmax(logits_BV.astype(jnp.float32), axis=-1)
    order_BV = jnp.argsort(-probs_BV, axis=-1, stable=True)
    sorted_BV = jnp.take_along_axis(probs_BV, order_BV, axis=-1)
    # Exclusive cumulative sum: the mass of the tokens ranked above each one.
    before_BV = jnp.cumsum(sorted_BV, axis=-1) - sorted_BV
    keep_sorted_BV = before_BV < p
    rank_BV = jnp.argsort(order_BV, axis=-1)  # inverse permutation: token -> its rank
    return jnp.take_along_axis(keep_sorted_BV, rank_BV, axis=-1)


def filter_logits(
    logits_BV: jax.Array,
    *,
    temperature: float | jax.Array = 1.0,
    top_k: int = 0,
    top_p: float | jax.Array | None = None,
) -> jax.Array:
    """Logits divided by `temperature`, outside top-k and outside the top-p nucleus masked.

    Args:
      logits_BV: float logits `(..., V)`.
      temperature: > 0; below 1 sharpens, above 1 flattens the distribution. Entries at
        `MASKED_LOGIT` (or below) stay there whatever the temperature.
      top_k: keep the k most likely tokens; 0 keeps all.
      top_p: keep the nucleus of mass p (after temperature and top-k); None keeps all.

    Returns:
      float32 `(..., V)`, masked entries `MASKED_LOGIT`.
    """
    logits_BV = logits_BV.astype(jnp.float32)
    # Masked tokens stay masked at any temperature: MASKED_LOGIT / 1e40 would be about 0,
    # level with the real tokens, and padding could be sampled.
    logits_BV = jnp.where(logits_BV <= MASKED_LOGIT, MASKED_LOGIT, logits_BV / temperature)
    if top_k:
        logits_BV = jnp.where(top_k_mask(logits_BV, top_k), logits_BV, MASKED_LOGIT)
    if top_p is not None:
        logits_BV = jnp.where(top_p_mask(logits_BV, top_p), logits_BV, MASKED_LOGIT)
    return logits_BV


def choose_tokens(
    logits_BV: jax.Array,
    rng: jax.Array | None,
    *,
    temperature: float | jax.Array | None = None,
    top_k: int = 0,
    top_p: float | jax.Array | None = None,
) -> jax.Array:
    """The next token of every row: argmax if `temperature` is None, else a sample.

    Args:
      logits_BV: float logits `(B, V)` (forbidden tokens already masked).
      rng: PRNG key for sampling (rows are sampled independently); unused when greedy.
      temperature, top_k, top_p: as in `filter_logits`; None temperature means greedy.

    Returns:
      int32 `(B,)`.
    """
    if temperature is None:
        return argmax_first(logits_BV)
    filtered_BV = filter_logits(logits_BV, temperature=temperature, top_k=top_k, top_p=top_p)
    return jax.random.categorical(rng, filtered_BV, axis=-1).astype(jnp.int32)
