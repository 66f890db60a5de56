"""Token cross-entropy, the objective of every task with a vocabulary head (translation, lm,
chat): the mean label-smoothed loss over a batch's scored tokens, and the metric sums the step
reports. A task with another objective (preference pairs, a reference model) overrides
`Task.loss` and `Task.eval_sums` and reports its own sums.

The sums, over the (global) batch: 'loss' (as trained: with label smoothing), 'nll' (without
it), 'correct' (argmax equal to the label), 'tokens' (labels that are not padding). The loop
divides them by 'tokens' to report per-token means.

The tasks' default objective (`Task.loss`, `Task.eval_sums`) is `head_cross_entropy` and
`head_eval_sums`: from the model's final hidden states and its head, block by block
(`flax_transformer.functional.blocked_cross_entropy`), so that `(tokens, vocabulary)`
float32 logits are never held whole, in training or evaluation. `token_cross_entropy` and
`token_eval_sums` compute the same sums from whole logits, for an objective that needs the
logits themselves (docs/training.md's z-loss example).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from flax_transformer.functional import (
    DEFAULT_BLOCK_ROWS,
    blocked_cross_entropy,
    label_smoothed_cross_entropy,
)


@dataclasses.dataclass(frozen=True)
class LossSetup:
    """What a task's objective needs of the run, bound once into the jitted steps.

    Attributes:
        pad_id: the model's padding id: labels equal to it are not scored.
        label_smoothing: the training loss's smoothing (validation scores without it).
        drop_pad_logit: the pad id is an id added after the checkpoint's vocabulary (an
            imported model, `train.data.hf_tokenizer`): its logit, the last, is left out of
            the softmax, so the loss is the checkpoint's own over its V ids.
        block_rows: about how many tokens one step of the blocked head and loss takes
            (`blocked_cross_entropy`; the library's DEFAULT_BLOCK_ROWS, 512, says why).
    """

    pad_id: int
    label_smoothing: float = 0.0
    drop_pad_logit: bool = False
    block_rows: int = DEFAULT_BLOCK_ROWS


def _scored_logits(logits: jax.Array, setup: LossSetup) -> jax.Array:
    return logits[..., : setup.pad_id] if setup.drop_pad_logit else logits


def _sums(logits, labels, loss, nll, weights) -> dict[str, jax.Array]:
    correct = (jnp.argmax(logits, axis=-1) == labels) * weights
    return {
        "loss": loss.sum(),
        "nll": nll.sum(),
        "correct": correct.sum(),
        "tokens": weights.sum(),
    }


def token_cross_entropy(
    logits: jax.Array, labels: jax.Array, setup: LossSetup
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The training objective of `(B, L, V)` logits and `(B, L)` labels.

    Returns:
        (the mean per-token loss, as differentiated; the metric sums of the batch).
    """
    logits = _scored_logits(logits, setup)
    loss, weights = label_smoothed_cross_entropy(
        logits, labels, label_smoothing=setup.label_smoothing, pad_id=setup.pad_id
    )
    if setup.label_smoothing:
        nll, _ = label_smoothed_cross_entropy(logits, labels, pad_id=setup.pad_id)
    else:  # without smoothing the loss is the nll: no second pass over the vocabulary
        nll = loss
    mean_loss = loss.sum() / jnp.maximum(weights.sum(), 1.0)
    return mean_loss, _sums(logits, labels, loss, nll, weights)


def token_eval_sums(logits: jax.Array, labels: jax.Array, setup: LossSetup) -> dict[str, jax.Array]:
    """The validation sums of `(B, L, V)` logits: no label smoothing ('loss' equals 'nll')."""
    logits = _scored_logits(logits, setup)
    nll, weights = label_smoothed_cross_entropy(logits, labels, pad_id=setup.pad_id)
    return _sums(logits, labels, nll, nll, weights)


def _head_sums(model, params, hidden_BLD, labels_BL, setup: LossSetup, smoothing: float):
    """The four sums of `blocked_cross_entropy` over the model's head (`output_head`)."""
    config = model.config
    kernel_DV, bias_V = model.output_head({"params": params})
    return blocked_cross_entropy(
        hidden_BLD,
        kernel_DV,
        labels_BL,
        (labels_BL != setup.pad_id).astype(jnp.float32),
        block_rows=setup.block_rows,
        label_smoothing=smoothing,
        num_scored_ids=setup.pad_id if setup.drop_pad_logit else None,
        bias_V=bias_V,
        logits_soft_cap=config.logits_soft_cap,
        dtype=config.dtype,
    )


def head_cross_entropy(
    model, params, hidden_BLD: jax.Array, labels_BL: jax.Array, setup: LossSetup
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """`token_cross_entropy` of the logits `model`'s head gives `(B, L, D)` hidden states
    (`hidden_states`), computed block by block: the logits are never held whole.

    Returns:
        (the mean per-token loss, as differentiated; the metric sums of the batch).
    """
    sums = _head_sums(model, params, hidden_BLD, labels_BL, setup, setup.label_smoothing)
    return sums["loss"] / jnp.maximum(sums["tokens"], 1.0), sums


def head_eval_sums(
    model, params, hidden_BLD: jax.Array, labels_BL: jax.Array, setup: LossSetup
) -> dict[str, jax.Array]:
    """`token_eval_sums` through the head, block by block (no label smoothing)."""
    return _head_sums(model, params, hidden_BLD, labels_BL, setup, 0.0)
