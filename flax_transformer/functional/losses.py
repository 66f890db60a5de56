"""Training losses: cross-entropy with label smoothing, padding excluded.

Label smoothing (Vaswani et al. 2017, section 5.4; Szegedy et al. 2016) trains against the
target distribution `(1 - eps) * onehot(label) + eps / V` (the uniform part spread over all V
classes, as `optax.smooth_labels` does), so the loss of one token is

    (1 - eps) * (-log p[label]) + eps * mean_v(-log p[v]).

With `eps = 0` this is the negative log-likelihood. Positions whose label is the padding id
contribute zero and are excluded from the token count, so a batch's mean loss is
`sum(loss) / sum(weights)` whatever the padding.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def label_smoothed_cross_entropy(
    logits: jax.Array,
    labels: jax.Array,
    *,
    label_smoothing: float = 0.0,
    pad_id: int | None = 0,
) -> tuple[jax.Array, jax.Array]:
    """Per-token label-smoothed cross-entropy, zero at padding.

    Computed in float32 whatever the logits' dtype.

    Args:
      logits: `(..., V)` unnormalised scores (e.g. `(B, T, V)`).
      labels: int `(...)` target ids in [0, V), same leading shape as `logits`.
      label_smoothing: eps in [0, 1): probability mass spread uniformly over the V classes.
      pad_id: label id whose positions are ignored; None counts every position.

    Returns:
      `(loss (...), weights (...))`, both float32: the per-token loss (0 at padding) and
      1.0 for real tokens, 0.0 for padding. The mean loss is `loss.sum() / weights.sum()`.
    """
    if logits.shape[:-1] != labels.shape:
        raise ValueError(
            f"logits (..., V) and labels (...) need the same leading shape: "
            f"{logits.shape=}, {labels.shape=}."
        )
    if not 0.0 <= label_smoothing < 1.0:
        raise ValueError(f"label_smoothing={label_smoothing} must be in [0, 1).")
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    nll = -jnp.take_along_axis(log_probs, labels[..., None], axis=-1)[..., 0]
    loss = nll
    if label_smoothing:
        uniform = -jnp.mean(log_probs, axis=-1)
        loss = (1.0 - label_smoothing) * nll + label_smoothing * uniform
    if pad_id is None:
        weights = jnp.ones(labels.shape, jnp.float32)
    else:
        weights = (labels != pad_id).astype(jnp.float32)
    return loss * weights, weights
