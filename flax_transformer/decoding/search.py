"""The decoding loops: one token per step under `jax.lax.while_loop`, for any `Stepper`.

`sample_loop` covers greedy decoding and sampling; `beam_search` keeps the best
`beam_size` hypotheses. Both stop early once every sequence has produced EOS, write
padding after EOS, and compile once per shape when jitted (`generate.py` jits them).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from flax_transformer.decoding.sampling import MASKED_LOGIT, mask_token
from flax_transformer.decoding.steppers import Stepper

# GNMT length penalty (Wu et al. 2016, eq. 14): lp(n) = ((BASE + n) / (BASE + 1)) ** alpha.
LENGTH_PENALTY_BASE = 5.0

# `(logits (R, V) float32, tokens so far (R, N) int32, step () int32) -> logits (R, V)`.
LogitsHook = Callable[[jax.Array, jax.Array, jax.Array], jax.Array]


def _is_eos(tokens: jax.Array, eos_id: int | None) -> jax.Array:
    return jnp.zeros(tokens.shape, jnp.bool_) if eos_id is None else tokens == eos_id


def _apply_hook(
    hook: LogitsHook | None, logits_RV: jax.Array, tokens_RN: jax.Array, step
) -> jax.Array:
    """`hook(logits, tokens, step)` as float32 logits of the same shape (None: unchanged).

    Raises ValueError (at trace time, before any compute) if the hook changes the shape.
    """
    if hook is None:
        return logits_RV
    hooked_RV = jnp.asarray(hook(logits_RV, tokens_RN, jnp.asarray(step, jnp.int32)))
    if hooked_RV.shape != logits_RV.shape:
        raise ValueError(
            f"logits_hook must return logits of the shape it was given, {logits_RV.shape}; "
            f"it returned {hooked_RV.shape}."
        )
    return hooked_RV.astype(jnp.float32)


def sample_loop(
    stepper: Stepper,
    choose: Callable[[jax.Array, int], jax.Array],
    *,
    max_new_tokens: int,
    eos_id: int | None,
    pad_id: int,
    return_logits: bool = False,
    logits_hook: LogitsHook | None = None,
) -> jax.Array | tuple[jax.Array, jax.Array]:
    """Generate up to `max_new_tokens` per sequence, one `choose` per step.

    Args:
      stepper: the model's logits, step by step.
      choose: `(logits (B, V) with padding masked, step i) -> tokens (B,)`: argmax, or a
        sample with the step's key.
      max_new_tokens: N.
      eos_id: sequences stop after producing it; None: never.
      pad_id: written after EOS; never generated.
      return_logits: also return the logits at each step.
      logits_hook: optional `(logits (B, V), tokens (B, N), step) -> logits (B, V)` applied
        to every step's logits before `choose`; `tokens` holds the tokens chosen so far,
        `pad_id` from column `step` on.

    Returns:
      int32 tokens `(B, N)`; with `return_logits`, also float32 `(B, N, V)`: row i the
      logits that chose token i, after `logits_hook` (undefined after a sequence's EOS).
    """
    logits_BV, state = stepper.start()
    batch, vocab = logits_BV.shape
    out_BN = jnp.full((batch, max_new_tokens), pad_id, jnp.int32)
    logits_BV = _apply_hook(logits_hook, logits_BV, out_BN, 0)
    tokens_B = choose(mask_token(logits_BV, pad_id), 0)
    out_BN = out_BN.at[:, 0].set(tokens_B)
    seen_BNV = None
    if return_logits:
        seen_BNV = jnp.zeros((batch, max_new_tokens, vocab), jnp.float32).at[:, 0].set(logits_BV)

    def cond(carry):
        i, _, _, done_B, _, _ = carry
        return (i < max_new_tokens) & ~jnp.all(done_B)

    def body(carry):
        i, tokens_B, out_BN, done_B, state, seen_BNV = carry
        logits_BV, state = stepper.step(state, tokens_B)
        logits_BV = _apply_hook(logits_hook, logits_BV, out_BN, i)
        tokens_B = jnp.where(done_B, pad_id, choose(mask_token(logits_BV, pad_id), i))
        out_BN = out_BN.at[:, i].set(tokens_B)
        if seen_BNV is not None:
            seen_BNV = seen_BNV.at[:, i].set(logits_BV)
        return i + 1, tokens_B, out_BN, done_B | _is_eos(tokens_B, eos_id), state, seen_BNV

    carry = (1, tokens_B, out_BN, _is_eos(tokens_B, eos_id), state, seen_BNV)
    _, _, out_BN, _, _, seen_BNV = jax.lax.while_loop(cond, body, carry)
    return (out_BN, seen_BNV) if return_logits else out_BN


def length_penalty(lengths: jax.Array, alpha: float | jax.Array) -> jax.Array:
    """GNMT's `((5 + n) / 6) ** alpha`: scores are log-probabilities divided by it."""
    base = LENGTH_PENALTY_BASE
    return ((base + lengths.astype(jnp.float32)) / (base + 1.0)) ** alpha


def _take(x_BK: jax.Array, index_BK: jax.Array) -> jax.Array:
    return jnp.take_along_axis(x_BK, index_BK, axis=1)


def _children_in_parent_rows(origin_BK: jax.Array) -> jax.Array:
    """Which new hypothesis goes to each of a sequence's K rows: int `(B, K)`.

    `origin_BK[b, j]` is the parent row of new hypothesis j (in score order). Each parent's
    first child takes the parent's own row; the other children take, in order, the rows
    of parents that had no child. Every row that is some hypothesis's parent then keeps
    its parent's contents, which lets the cache copy only the rows that change
    (`decoding.cache.move_rows`). The hypotheses' order does not matter to the search.
    """
    k = origin_BK.shape[1]
    hyp_K = jnp.arange(k)
    same_BKK = origin_BK[:, :, None] == origin_BK[:, None, :]
    # Hypothesis j is its parent's first child if no earlier hypothesis has that parent.
    first_BK = ~jnp.any(same_BKK & (hyp_K[None, :] < hyp_K[:, None]), axis=2)
    has_child_BK = jnp.any(origin_BK[:, :, None] == hyp_K[None, None, :], axis=1)
    free_rows_BK = jnp.argsort(has_child_BK, axis=1, stable=True)  # childless rows first
    later_rank_BK = jnp.cumsum(~first_BK, axis=1) - 1
    row_BK = jnp.where(first_BK, origin_BK, _take(free_rows_BK, jnp.maximum(later_rank_BK, 0)))
    return jnp.argsort(row_BK, axis=1)  # the inverse: row -> hypothesis


def beam_search(
    stepper: Stepper,
    *,
    beam_size: int,
    max_new_tokens: int,
    eos_id: int | None,
    pad_id: int,
    alpha: float | jax.Array,
    logits_hook: LogitsHook | None = None,
) -> jax.Array:
    """The best of `beam_size` hypotheses per sequence by length-normalised log-probability.

    Each sequence keeps exactly K = `beam_size` hypotheses. A hypothesis that produced EOS
    is finished: it stays in the beam with its score frozen (it extends only by padding, at
    no cost) and competes with the live ones for the K places by its normalised score
    `log p / lp(length)`, `lp` the GNMT length penalty with exponent `alpha` and `length`
    the tokens generated, EOS included. Live hypotheses of one step all have the same
    length, so among them the rank is by log-probability; with K = 1 the search is greedy
    decoding exactly. The loop ends when all hypotheses have finished or after
    `max_new_tokens`; unfinished ones are then scored at their full length.

    `logits_hook`, if given, maps every step's logits `(B * K, V)` (row `b * K + k`:
    hypothesis k of sequence b), with the hypotheses' tokens so far `(B * K, N)` (`pad_id`
    from column `step` on) and the step, to the logits that are scored.

    Returns:
      int32 `(B, max_new_tokens)`: the best hypothesis, EOS included, padding after it.
    """
    logits_BV, state = stepper.start()
    batch, vocab = logits_BV.shape
    k = beam_size
    # Every beam starts as a copy of the prompt; only beam 0 is live at first, so the first
    # step's K hypotheses are K different tokens.
    state = stepper.reorder(state, jnp.repeat(jnp.arange(batch), k))
    logits_RV = jnp.repeat(logits_BV, k, axis=0)  # R = B * K rows
    logprob_BK = jnp.full((batch, k), MASKED_LOGIT, jnp.float32).at[:, 0].set(0.0)
    finished_BK = jnp.zeros((batch, k), jnp.bool_)
    length_BK = jnp.zeros((batch, k), jnp.int32)
    seqs_BKN = jnp.full((batch, k, max_new_tokens), pad_id, jnp.int32)
    is_pad_V = jnp.arange(vocab) == pad_id

    def expand(i, logits_RV, logprob_BK, finished_BK, length_BK, seqs_BKN):
        """Step i: the K best one-token extensions of the K hypotheses of each sequence."""
        tokens_RN = seqs_BKN.reshape(batch * k, max_new_tokens)
        logits_RV = _apply_hook(logits_hook, logits_RV, tokens_RN, i)
        logp_BKV = jax.nn.log_softmax(mask_token(logits_RV, pad_id)).reshape(batch, k, vocab)
        live_BKV = logprob_BK[..., None] + logp_BKV
        # A finished hypothesis has one candidate: itself, extended by padding.
        stay_BKV = jnp.where(is_pad_V, logprob_BK[..., None], MASKED_LOGIT)
        cand_BKV = jnp.where(finished_BK[..., None], stay_BKV, live_BKV)
        cand_len_BK = jnp.where(finished_BK, length_BK, i + 1)
        score_BKV = cand_BKV / length_penalty(cand_len_BK, alpha)[..., None]
        _, flat_BK = jax.lax.top_k(score_BKV.reshape(batch, k * vocab), k)
        origin_BK, token_BK = flat_BK // vocab, (flat_BK % vocab).astype(jnp.int32)
        logprob_BK = jnp.take_along_axis(cand_BKV.reshape(batch, k * vocab), flat_BK, axis=1)
        was_finished_BK = jnp.take_along_axis(finished_BK, origin_BK, axis=1)
        length_BK = jnp.take_along_axis(cand_len_BK, origin_BK, axis=1)
        finished_BK = was_finished_BK | _is_eos(token_BK, eos_id)
        # Put each hypothesis's first child in its parent's row, so that the cache moves
        # only the rows of hypotheses that left no child (`Stepper.move`).
        hyp_BK = _children_in_parent_rows(origin_BK)
        origin_BK, token_BK = _take(origin_BK, hyp_BK), _take(token_BK, hyp_BK)
        logprob_BK, length_BK = _take(logprob_BK, hyp_BK), _take(length_BK, hyp_BK)
        finished_BK = _take(finished_BK, hyp_BK)
        seqs_BKN = jnp.take_along_axis(seqs_BKN, origin_BK[..., None], axis=1)
        seqs_BKN = seqs_BKN.at[:, :, i].set(token_BK)
        rows_R = (jnp.arange(batch)[:, None] * k + origin_BK).reshape(-1)
        return logprob_BK, finished_BK, length_BK, seqs_BKN, rows_R, token_BK.reshape(-1)

    def cond(carry):
        i, finished_BK = carry[0], carry[2]
        return (i < max_new_tokens) & ~jnp.all(finished_BK)

    def body(carry):
        i, logprob_BK, finished_BK, length_BK, seqs_BKN, rows_R, tokens_R, state = carry
        logits_RV, state = stepper.step(stepper.move(state, rows_R), tokens_R)
        beams = expand(i, logits_RV, logprob_BK, finished_BK, length_BK, seqs_BKN)
        return (i + 1, *beams, state)

    beams = expand(0, logits_RV, logprob_BK, finished_BK, length_BK, seqs_BKN)
    carry = jax.lax.while_loop(cond, body, (1, *beams, state))
    _, logprob_BK, _, length_BK, seqs_BKN = carry[:5]
    best_B = jnp.argmax(logprob_BK / length_penalty(length_BK, alpha), axis=1)
    return jnp.take_along_axis(seqs_BKN, best_B[:, None, None], axis=1)[:, 0]
