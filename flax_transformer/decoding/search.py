"""The decoding loops: one token per step under `jax.lax.while_loop`, for any `Stepper`.

`sample_loop` covers greedy decoding and sampling and stops early once every sequence has
produced EOS; `beam_search` keeps `beam_size` live and, apart, `beam_size` finished
hypotheses and stops early once no live one can beat the finished ones. Both write padding
after EOS and compile once per shape when jitted (`generate.py` jits them).
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


# A log-probability below this holds a masked token (`MASKED_LOGIT`, or a beam that
# never lived): no real hypothesis reaches it, and beam search drops such hypotheses.
_DROPPED = MASKED_LOGIT / 2


def _take(x_BK: jax.Array, index_BK: jax.Array) -> jax.Array:
    return jnp.take_along_axis(x_BK, index_BK, axis=1)


def _children_in_parent_rows(origin_BK: jax.Array) -> jax.Array:
    """Which new hypothesis goes to each of a sequence's K rows: int `(B, K)`.

    `origin_BK[b, j]` is the parent row of new hypothesis j (in score order). Each parent's
    first child takes the parent's own row; the other children take, in order, the rows
    of parents that had no child. Every row that is some hypothesis's parent then keeps
    its parent's contents, which lets the cache copy only the rows that change
    (`cache.move_rows`). The hypotheses' order does not matter to the search.
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
    """The best hypothesis per sequence by length-normalised log-probability.

    Each sequence keeps two sets of K = `beam_size` hypotheses: K live ones, which the
    model extends, and the K best finished ones, with their scores, apart from them (as in
    the Flax wmt example and Hugging Face's `BeamSearchScorer`). A hypothesis's score is
    `log p / lp(n)`, `lp` the GNMT length penalty with exponent `alpha` >= 0 and `n` its
    tokens, EOS included. At step i the K live hypotheses' one-token extensions are ranked
    by log-probability (all have length i + 1); those among the K best that end (with
    EOS, or at `max_new_tokens`) join the finished set, which keeps its K best by score,
    and the K best that do not end become the live ones. A finished hypothesis leaves its
    set only for a better-scoring finished one, never for a live one.

    The loop stops after `max_new_tokens` steps, or earlier once no sequence's live
    hypotheses can still beat its worst kept finished one: an extension only lowers the
    log-probability `log p <= 0`, and `lp` grows with n, so `log p / lp(max_new_tokens)`
    bounds every score a live hypothesis can still reach. With K = 1 and `alpha` = 0 the
    search is greedy decoding exactly; with `alpha` > 0 the search may continue past
    greedy's EOS and find a longer hypothesis that scores better.

    The padding token is masked before the log-softmax, so the log-probabilities are
    renormalised over the other tokens. A hypothesis that takes a masked token (padding,
    or one a hook set to `MASKED_LOGIT`) is dropped.

    `logits_hook`, if given, maps every step's logits `(B * K, V)` (row `b * K + k`: live
    hypothesis k of sequence b), with the live hypotheses' tokens so far `(B * K, N)`
    (`pad_id` from column `step` on) and the step, to the logits that are scored.

    Returns:
      int32 `(B, max_new_tokens)`: the best finished hypothesis, EOS included, padding
      after it (all padding if every token was masked).
    """
    logits_BV, state = stepper.start()
    batch, vocab = logits_BV.shape
    k = beam_size
    # At most K of the 2K best extensions end (one EOS per live hypothesis), so they hold
    # K that do not; a vocabulary of one token has only K extensions.
    cands = min(2 * k, k * vocab)
    max_penalty = length_penalty(jnp.asarray(max_new_tokens), alpha)
    # Every beam starts as a copy of the prompt; only beam 0 is live at first, so the first
    # step's K hypotheses are K different tokens.
    state = stepper.reorder(state, jnp.repeat(jnp.arange(batch), k))
    logits_RV = jnp.repeat(logits_BV, k, axis=0)  # R = B * K rows
    live_lp_BK = jnp.full((batch, k), MASKED_LOGIT, jnp.float32).at[:, 0].set(0.0)
    live_BKN = jnp.full((batch, k, max_new_tokens), pad_id, jnp.int32)
    fin_score_BK = jnp.full((batch, k), MASKED_LOGIT, jnp.float32)  # empty slots
    fin_BKN = live_BKN

    def expand(i, logits_RV, live_lp_BK, live_BKN, fin_score_BK, fin_BKN):
        """Step i: the K best live and finished hypotheses after one more token."""
        tokens_RN = live_BKN.reshape(batch * k, max_new_tokens)
        logits_RV = _apply_hook(logits_hook, logits_RV, tokens_RN, i)
        logp_BKV = jax.nn.log_softmax(mask_token(logits_RV, pad_id)).reshape(batch, k, vocab)
        cand_BKV = live_lp_BK[..., None] + logp_BKV
        lp_BC, flat_BC = jax.lax.top_k(cand_BKV.reshape(batch, k * vocab), cands)
        origin_BC, token_BC = flat_BC // vocab, (flat_BC % vocab).astype(jnp.int32)
        ends_BC = _is_eos(token_BC, eos_id) | (i + 1 >= max_new_tokens)
        real_BC = lp_BC > _DROPPED
        # The finished set: its K best of itself and this step's ending extensions among
        # the K best.
        joins_BC = ends_BC & real_BC & (jnp.arange(cands) < k)
        score_BC = jnp.where(
            joins_BC, lp_BC / length_penalty(jnp.asarray(i + 1), alpha), MASKED_LOGIT
        )
        ended_BCN = jnp.take_along_axis(live_BKN, origin_BC[..., None], axis=1)
        ended_BCN = ended_BCN.at[:, :, i].set(token_BC)
        # Kept first, so a tie keeps the older finished hypothesis.
        fin_score_BK, pick_BK = jax.lax.top_k(
            jnp.concatenate([fin_score_BK, score_BC[:, :k]], axis=1), k
        )
        fin_BKN = _take(jnp.concatenate([fin_BKN, ended_BCN[:, :k]], axis=1), pick_BK[..., None])
        # The live set: the K best extensions that do not end.
        _, pick_BK = jax.lax.top_k(jnp.where(ends_BC, -jnp.inf, lp_BC), k)
        origin_BK, token_BK = _take(origin_BC, pick_BK), _take(token_BC, pick_BK)
        live_lp_BK = _take(lp_BC, pick_BK)
        # Put each hypothesis's first child in its parent's row, so that the cache moves
        # only the rows of hypotheses that left no child (`Stepper.move`).
        hyp_BK = _children_in_parent_rows(origin_BK)
        origin_BK, token_BK = _take(origin_BK, hyp_BK), _take(token_BK, hyp_BK)
        live_lp_BK = _take(live_lp_BK, hyp_BK)
        live_BKN = _take(live_BKN, origin_BK[..., None]).at[:, :, i].set(token_BK)
        rows_R = (jnp.arange(batch)[:, None] * k + origin_BK).reshape(-1)
        # A sequence is done when its best live hypothesis, at its best reachable score,
        # cannot beat its worst finished one (an empty slot: MASKED_LOGIT).
        best_B = jnp.max(live_lp_BK, axis=1)
        open_B = (best_B > _DROPPED) & (best_B / max_penalty > jnp.min(fin_score_BK, axis=1))
        beams = live_lp_BK, live_BKN, fin_score_BK, fin_BKN
        return *beams, jnp.any(open_B), rows_R, token_BK.reshape(-1)

    def cond(carry):
        i, open_ = carry[0], carry[5]
        return (i < max_new_tokens) & open_

    def body(carry):
        i, *beams, _, rows_R, tokens_R, state = carry
        logits_RV, state = stepper.step(stepper.move(state, rows_R), tokens_R)
        return (i + 1, *expand(i, logits_RV, *beams), state)

    first = expand(0, logits_RV, live_lp_BK, live_BKN, fin_score_BK, fin_BKN)
    carry = jax.lax.while_loop(cond, body, (1, *first, state))
    fin_score_BK, fin_BKN = carry[3], carry[4]
    best_B = jnp.argmax(fin_score_BK, axis=1)
    return _take(fin_BKN, best_B[:, None, None])[:, 0]
