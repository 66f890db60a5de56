"""The vocabulary head and its cross-entropy in blocks of rows: no `(N, V)` logits held whole.

A language model's last step multiplies the hidden states `(B, T, D)` by the head `(D, V)`
and takes a softmax over V: at SmolLM2's 16 x 128 tokens and 49,153 ids, 400 MB of float32
logits per copy, kept for the backward pass. Here the positions are cut into blocks of
`block_rows // B` (at least 1) and scanned (`jax.lax.scan`): each step computes the logits
of one block, `(B, block, V)`, about `block_rows` rows, its losses and metrics, and only
the running sums leave it. The batch axis stays whole in every step, so a batch sharded
over devices stays sharded. The step is rematerialised
(`jax.checkpoint`), so the backward pass recomputes each block's logits from its hidden
rows instead of storing them; the head's gradient is summed block by block. The largest
array alive, forward or backward, is `(B, block, V)`. (Levanter's blockwise
cross-entropy, MaxText's vocabulary tiling, Liger's fused linear cross-entropy and Apple's
Cut Cross-Entropy do the same.)

The result equals `label_smoothed_cross_entropy` of the full logits, summed, to float32
rounding (the sums run in another order), values and gradients. `blocked_label_logps` runs
the same blocks for a sequence-level objective (DPO): each row's summed log p(label) and
mean logit, `(B,)`, carried through the scan instead of batch-wide sums.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from flax_transformer.checks.arguments import check_int, check_number
from flax_transformer.functional.precision import mixed_einsum
from flax_transformer.functional.soft_cap import soft_cap

# Rows (tokens) per scan step, about. 512 rows of a 49,152-id vocabulary are 100 MB of
# float32 logits, a quarter of the 2,048-token batch's 400 MB; smaller blocks save little
# more memory (the head's float32 gradient, D x V, stays) and each step pays the scan's
# fixed cost.
DEFAULT_BLOCK_ROWS = 512

# The sums returned, in order.
SUM_NAMES = ("loss", "nll", "correct", "tokens")
# The per-row sums of `blocked_label_logps`, in order.
LABEL_LOGP_NAMES = ("logps", "mean_logits", "tokens")


def _head_logits(hidden_RD, head_DV, bias_V, *, cap, dtype):
    """`(R, V)` float32 logits of rows `(R, D)`, as the models' heads compute them."""
    logits_RV = mixed_einsum("rd,dv->rv", hidden_RD, head_DV, dtype=dtype)
    if bias_V is not None:
        logits_RV = logits_RV + bias_V.astype(logits_RV.dtype)
    if cap:
        logits_RV = soft_cap(logits_RV, cap)
    return logits_RV


def _label_log_probs(hidden_BKD, labels_BK, weights_BK, head_DV, bias_V, *, cap, dtype):
    """One block's scored logits and log-probabilities, both `(R, V)` (R = B x K), each
    row's log p(label) `(R,)` and which rows are scored `(R,)`."""
    hidden_RD = hidden_BKD.reshape(-1, hidden_BKD.shape[-1])
    labels_R, weights_R = labels_BK.reshape(-1), weights_BK.reshape(-1)
    logits_RV = _head_logits(hidden_RD, head_DV, bias_V, cap=cap, dtype=dtype)
    vocab = logits_RV.shape[-1]
    scored_R = weights_R > 0
    # Rows that are not scored are replaced, not multiplied by zero: a NaN there gives 0.
    logits_RV = jnp.where(scored_R[:, None], logits_RV, 0.0)
    log_probs_RV = jax.nn.log_softmax(logits_RV, axis=-1)
    in_range_R = (labels_R >= 0) & (labels_R < vocab)
    safe_R = jnp.where(in_range_R, labels_R, 0)
    picked_R = jnp.take_along_axis(log_probs_RV, safe_R[:, None], axis=-1)[:, 0]
    # A scored label outside the ids reads NaN (as label_smoothed_cross_entropy does).
    logp_R = jnp.where(in_range_R, picked_R, jnp.nan)
    return logits_RV, log_probs_RV, logp_R, scored_R


def _block_sums(hidden_BKD, labels_BK, weights_BK, head_DV, bias_V, *, smoothing, cap, dtype):
    """The four sums of one block of positions (see `blocked_cross_entropy`); R = B x K."""
    logits_RV, log_probs_RV, logp_R, scored_R = _label_log_probs(
        hidden_BKD, labels_BK, weights_BK, head_DV, bias_V, cap=cap, dtype=dtype
    )
    labels_R, weights_R = labels_BK.reshape(-1), weights_BK.reshape(-1)
    nll_R = -logp_R
    loss_R = nll_R
    if smoothing:
        loss_R = (1.0 - smoothing) * nll_R - smoothing * jnp.mean(log_probs_RV, axis=-1)
    correct_R = jnp.argmax(logits_RV, axis=-1) == labels_R
    return (
        jnp.sum(jnp.where(scored_R, loss_R, 0.0) * weights_R),
        jnp.sum(jnp.where(scored_R, nll_R, 0.0) * weights_R),
        jnp.sum(jnp.where(scored_R & correct_R, weights_R, 0.0)),
        jnp.sum(weights_R),
    )


def _block_label_logps(hidden_BKD, labels_BK, weights_BK, head_DV, bias_V, *, cap, dtype):
    """The three per-row sums of one block (see `blocked_label_logps`), each `(B,)`."""
    logits_RV, _, logp_R, scored_R = _label_log_probs(
        hidden_BKD, labels_BK, weights_BK, head_DV, bias_V, cap=cap, dtype=dtype
    )
    shape_BK = labels_BK.shape
    weights_BK = weights_BK.astype(jnp.float32)
    scored_BK = scored_R.reshape(shape_BK)
    logp_BK = logp_R.reshape(shape_BK)
    # TRL's `logits/*` metric: reported, never differentiated.
    mean_logit_BK = jax.lax.stop_gradient(jnp.mean(logits_RV, axis=-1)).reshape(shape_BK)
    return (
        jnp.sum(jnp.where(scored_BK, logp_BK, 0.0) * weights_BK, axis=1),
        jnp.sum(jnp.where(scored_BK, mean_logit_BK, 0.0) * weights_BK, axis=1),
        jnp.sum(weights_BK, axis=1),
    )


def _checked_inputs(
    fn, hidden_BTD, head_DV, labels_BT, weights_BT, *, block_rows, num_scored_ids, bias_V, cap
):
    """The arguments as arrays, checked, with the head (and bias) cut to the scored ids.

    Raises:
        ValueError, TypeError: as `blocked_cross_entropy` says, naming `fn`.
    """
    hidden_BTD, head_DV = jnp.asarray(hidden_BTD), jnp.asarray(head_DV)
    labels_BT, weights_BT = jnp.asarray(labels_BT), jnp.asarray(weights_BT, jnp.float32)
    if hidden_BTD.ndim != 3 or head_DV.ndim != 2 or hidden_BTD.shape[2] != head_DV.shape[0]:
        raise ValueError(
            f"{fn}: hidden_BTD must be (B, T, D) and head_DV (D, V) with the same D, got "
            f"{hidden_BTD.shape=}, {head_DV.shape=}."
        )
    batch, length, _ = hidden_BTD.shape
    vocab = head_DV.shape[1]
    if labels_BT.shape != (batch, length) or weights_BT.shape != (batch, length):
        raise ValueError(
            f"{fn}: labels_BT and weights_BT must be (B, T) = {(batch, length)}, one per "
            f"position of hidden_BTD, got {labels_BT.shape=}, {weights_BT.shape=}."
        )
    if not jnp.issubdtype(labels_BT.dtype, jnp.integer):
        raise TypeError(f"{fn}: labels_BT must be int ids, got dtype {labels_BT.dtype}.")
    if bias_V is not None and jnp.shape(bias_V) != (vocab,):
        raise ValueError(f"{fn}: bias_V must be ({vocab},), got {jnp.shape(bias_V)}.")
    check_int(fn, "block_rows", block_rows, low=1, what=">= 1 (rows per scan step)")
    check_number(fn, "logits_soft_cap", cap, low=0.0)
    if num_scored_ids is not None:
        check_int(fn, "num_scored_ids", num_scored_ids, low=1, what=f"in [1, V={vocab}]")
        if num_scored_ids > vocab:
            raise ValueError(
                f"{fn}: num_scored_ids={num_scored_ids} exceeds the head's V={vocab} ids; pass "
                "at most V (None scores all)."
            )
        head_DV = head_DV[:, :num_scored_ids]
        bias_V = None if bias_V is None else bias_V[:num_scored_ids]
    return hidden_BTD, head_DV, labels_BT, weights_BT, bias_V


def _summed_over_blocks(block_fn, head_DV, bias_V, hidden_BTD, labels_BT, weights_BT, block_rows):
    """`block_fn(hidden_BKD, labels_BK, weights_BK, head_DV, bias_V)`'s tuple of sums,
    summed over blocks of `max(1, block_rows // B)` positions of all B rows in a
    rematerialised scan; called once on everything when one block holds every position."""
    batch, length = labels_BT.shape
    block = max(1, min(block_rows // max(batch, 1), length))
    padded = -(-length // block) * block
    if padded == block:
        # One block holds every row: the logits are whole either way, so no scan and no
        # recomputation (the backward pass keeps them, as the whole-logits loss does).
        return block_fn(hidden_BTD, labels_BT, weights_BT, head_DV, bias_V)

    def blocks(x):
        """`(B, T, ...)` -> `(T' / block, B, block, ...)`, T padded to T' (weight 0)."""
        widths = [(0, 0), (0, padded - length)] + [(0, 0)] * (x.ndim - 2)
        x = jnp.pad(x, widths).reshape(batch, padded // block, block, *x.shape[2:])
        return jnp.moveaxis(x, 1, 0)

    xs = (blocks(hidden_BTD), blocks(labels_BT), blocks(weights_BT))

    # Rematerialised: the backward pass recomputes the block's logits from its rows.
    @jax.checkpoint
    def block_sums(head_DV, bias_V, hidden_BKD, labels_BK, weights_BK):
        return block_fn(hidden_BKD, labels_BK, weights_BK, head_DV, bias_V)

    def step(carry, x):
        sums = block_sums(head_DV, bias_V, *x)
        return tuple(c + s for c, s in zip(carry, sums, strict=True)), None

    # The sums' shapes and dtypes (scalars, or one per row), without computing them.
    shapes = jax.eval_shape(block_sums, head_DV, bias_V, *(x[0] for x in xs))
    zeros = tuple(jnp.zeros(s.shape, s.dtype) for s in shapes)
    sums, _ = jax.lax.scan(step, zeros, xs)
    return sums


def blocked_cross_entropy(
    hidden_BTD: jax.Array,
    head_DV: jax.Array,
    labels_BT: jax.Array,
    weights_BT: jax.Array,
    *,
    block_rows: int = DEFAULT_BLOCK_ROWS,
    label_smoothing: float = 0.0,
    num_scored_ids: int | None = None,
    bias_V: jax.Array | None = None,
    logits_soft_cap: float = 0.0,
    dtype: Any = None,
) -> dict[str, jax.Array]:
    """Sums of the label-smoothed cross-entropy of `hidden_BTD @ head_DV`, block by block.

    The logits of a block are `hidden @ head` under the mixed-precision policy (operands in
    `dtype`, sum in float32; `functional.precision`), plus `bias_V`, soft-capped when
    `logits_soft_cap` > 0 (`soft_cap`), then the first `num_scored_ids` ids kept: the
    models' heads, computed as they compute them.

    Args:
      hidden_BTD: the final hidden states `(B, T, D)` (a model's `hidden_states`).
      head_DV: the output projection `(D, V)` (a model's `output_head`).
      labels_BT: int target ids `(B, T)`; those of positions with weight 0 may hold
        anything (padding).
      weights_BT: float `(B, T)`, 1 for a scored token and 0 for padding (any weight >= 0
        multiplies that token's terms).
      block_rows: about how many rows (tokens) one scan step takes, an int >= 1: each step
        takes `max(1, block_rows // B)` positions of all B rows (T is padded up to a
        multiple of that).
      label_smoothing: eps in [0, 1), as `label_smoothed_cross_entropy`: the target is
        `(1 - eps) onehot + eps / V'` over the V' scored ids.
      num_scored_ids: score the first V' ids only (an id appended after a checkpoint's
        vocabulary, such as a padding id, left out of the softmax); None: all V.
      bias_V: the head's bias `(V,)`, or None.
      logits_soft_cap: `c * tanh(logits / c)` on the logits when > 0 (Gemma 2); 0: off.
      dtype: the compute dtype of the head's product; None: the hidden states' dtype.

    Returns:
      float32 sums over the tokens: 'loss' (with label smoothing), 'nll' (without),
      'correct' (argmax of the scored logits equal to the label), 'tokens' (the weights'
      sum). Differentiable in `hidden_BTD`, `head_DV` and `bias_V`.

    Raises:
      ValueError: shapes that do not fit, `block_rows` < 1, `label_smoothing` outside
        [0, 1), `num_scored_ids` outside [1, V].
    """
    fn = "blocked_cross_entropy"
    check_number(fn, "label_smoothing", label_smoothing, low=0.0, high=1.0, high_open=True)
    hidden_BTD, head_DV, labels_BT, weights_BT, bias_V = _checked_inputs(
        fn,
        hidden_BTD,
        head_DV,
        labels_BT,
        weights_BT,
        block_rows=block_rows,
        num_scored_ids=num_scored_ids,
        bias_V=bias_V,
        cap=logits_soft_cap,
    )
    block_fn = functools.partial(
        _block_sums,
        smoothing=float(label_smoothing),
        cap=float(logits_soft_cap),
        dtype=hidden_BTD.dtype if dtype is None else dtype,
    )
    sums = _summed_over_blocks(
        block_fn, head_DV, bias_V, hidden_BTD, labels_BT, weights_BT, block_rows
    )
    return dict(zip(SUM_NAMES, sums, strict=True))


def blocked_label_logps(
    hidden_BTD: jax.Array,
    head_DV: jax.Array,
    labels_BT: jax.Array,
    weights_BT: jax.Array,
    *,
    block_rows: int = DEFAULT_BLOCK_ROWS,
    num_scored_ids: int | None = None,
    bias_V: jax.Array | None = None,
    logits_soft_cap: float = 0.0,
    dtype: Any = None,
) -> dict[str, jax.Array]:
    """Each row's summed log-probability of its labels under `hidden_BTD @ head_DV`, block
    by block: what a sequence-level objective (DPO and its kin) needs, per row, without the
    `(B, T, V)` logits held whole.

    The logits, the blocks and the arguments are `blocked_cross_entropy`'s (no label
    smoothing: a sequence's log-probability has none).

    Args:
      hidden_BTD: the final hidden states `(B, T, D)` (a model's `hidden_states`).
      head_DV: the output projection `(D, V)` (a model's `output_head`).
      labels_BT: int target ids `(B, T)`; those of positions with weight 0 may hold
        anything (padding).
      weights_BT: float `(B, T)`, 1 for a scored token and 0 for padding (any weight >= 0
        multiplies that token's terms).
      block_rows: about how many rows (tokens) one scan step takes, an int >= 1.
      num_scored_ids: the first V' ids only make the softmax and the mean logit; None: all.
      bias_V: the head's bias `(V,)`, or None.
      logits_soft_cap: `c * tanh(logits / c)` on the logits when > 0; 0: off.
      dtype: the compute dtype of the head's product; None: the hidden states' dtype.

    Returns:
      float32 `(B,)` sums over each row's positions, weighted: 'logps' (log p(label)),
      'mean_logits' (the mean over the V' scored ids of the logits, without gradient: TRL's
      `logits/*` numerator) and 'tokens' (the weights' sum). 'logps' is differentiable in
      `hidden_BTD`, `head_DV` and `bias_V`; a scored label outside the scored ids gives NaN.

    Raises:
      ValueError: shapes that do not fit, `block_rows` < 1, `num_scored_ids` outside
        [1, V], a negative `logits_soft_cap`.
    """
    hidden_BTD, head_DV, labels_BT, weights_BT, bias_V = _checked_inputs(
        "blocked_label_logps",
        hidden_BTD,
        head_DV,
        labels_BT,
        weights_BT,
        block_rows=block_rows,
        num_scored_ids=num_scored_ids,
        bias_V=bias_V,
        cap=logits_soft_cap,
    )
    block_fn = functools.partial(
        _block_label_logps,
        cap=float(logits_soft_cap),
        dtype=hidden_BTD.dtype if dtype is None else dtype,
    )
    sums = _summed_over_blocks(
        block_fn, head_DV, bias_V, hidden_BTD, labels_BT, weights_BT, block_rows
    )
    return dict(zip(LABEL_LOGP_NAMES, sums, strict=True))


__all__ = [
    "DEFAULT_BLOCK_ROWS",
    "LABEL_LOGP_NAMES",
    "SUM_NAMES",
    "blocked_cross_entropy",
    "blocked_label_logps",
]
