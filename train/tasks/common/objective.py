"""Token cross-entropy, the objective of every task with a vocabulary head (translation, lm,
chat): the mean label-smoothed loss over a batch's scored tokens, and the metric sums the step
reports. A task with another objective (preference pairs, a reference model) overrides
`Task.loss` and `Task.eval_sums` and reports its own sums.

The sums, over the (global) batch: 'loss' (as trained: with label smoothing), 'nll' (without
it), 'correct' (argmax equal to the label), 'tokens' (labels that are not padding). The loop
divides them by 'tokens' to report per-token means.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from flax_transformer.functional import label_smoothed_cross_entropy


@dataclasses.dataclass(frozen=True)
class LossSetup:
    """What a task's objective needs of the run, bound once into the jitted steps.

    Attributes:
        pad_id: the model's padding id: labels equal to it are not scored.
        label_smoothing: the training loss's smoothing (validation scores without it).
        drop_pad_logit: the pad id is an id added after the checkpoint's vocabulary (an
            imported model, `train.data.hf_tokenizer`): its logit, the last, is left out of
            the softmax, so the loss is the checkpoint's own over its V ids.
    """

    pad_id: int
    label_smoothing: float = 0.0
    drop_pad_logit: bool = False


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
