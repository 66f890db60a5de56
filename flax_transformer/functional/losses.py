"""Training losses: cross-entropy with label smoothing, padding excluded.

Label smoothing (Vaswani et al. 2017, section 5.4; Szegedy et al. 2016) trains against the
target distribution `(1 - eps) * onehot(label) + eps / V` (the uniform part spread over all V
classes, as `optax.smooth_labels` does), so the loss of one token is

    (1 - eps) * (-log p[label]) + eps * mean_v(-log p[v]).

With `eps = 0` this is the negative log-likelihood. Positions whose label is the padding id
contribute zero and are excluded from the token count, so a batch's mean loss is
`sum(loss) / sum(weights)` whatever the padding. The padding id may lie outside [0, V)
(torch's ignore index -100); every other label must lie in [0, V).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from flax_transformer.checks.arguments import check_floating, check_number, is_concrete
from flax_transformer.checks.traced import runtime_check


def label_smoothed_cross_entropy(
    logits: jax.Array,
    labels: jax.Array,
    *,
    label_smoothing: float = 0.0,
    pad_id: int | None = 0,
    debug_checks: bool = False,
) -> tuple[jax.Array, jax.Array]:
    """Per-token label-smoothed cross-entropy, zero at padding.

    Computed in float32 whatever the logits' dtype.

    Args:
      logits: `(..., V)` unnormalised scores (e.g. `(B, T, V)`).
      labels: int `(...)` target ids in [0, V), same leading shape as `logits`; positions
        equal to `pad_id` may hold it even when it lies outside [0, V).
      label_smoothing: eps in [0, 1): probability mass spread uniformly over the V classes.
      pad_id: label id whose positions are ignored; None counts every position.
      debug_checks: under `jit`, make the label range a `checkify` check (run the jitted
        function through `flax_transformer.checked`), as `TransformerConfig.debug_checks`
        does for the models' inputs; pass the model's `config.debug_checks`.

    Returns:
      `(loss (...), weights (...))`, both float32: the per-token loss (exactly 0 at
      padding, with gradient 0, whatever the logits there hold, NaN included) and 1.0
      for real tokens, 0.0 for padding. The mean loss is `loss.sum() / weights.sum()`.

    Raises:
      ValueError: shapes differ, label_smoothing is outside [0, 1), or (for concrete
        labels) a label other than pad_id lies outside [0, V). Under `jit` the labels are
        tracers: with `debug_checks` the range is a checkify check; without, such a label
        (V included: a vocabulary one too small) gives a NaN loss at its position (never a
        wrap-around to another class), which a training loop that stops on a NaN loss
        reports.
      TypeError: logits not floating, labels not int, or pad_id not an int.
    """
    fn = "label_smoothed_cross_entropy"
    logits, labels = jnp.asarray(logits), jnp.asarray(labels)
    if logits.ndim < 1 or logits.shape[:-1] != labels.shape:
        raise ValueError(
            f"logits (..., V) and labels (...) need the same leading shape: "
            f"{logits.shape=}, {labels.shape=}."
        )
    check_floating(fn, "logits", logits)
    if not jnp.issubdtype(labels.dtype, jnp.integer):
        raise TypeError(f"{fn}: labels must be int class ids, got dtype {labels.dtype}.")
    check_number(fn, "label_smoothing", label_smoothing, low=0.0, high=1.0, high_open=True)
    if pad_id is not None and (
        isinstance(pad_id, bool) or not isinstance(pad_id, int | np.integer)
    ):
        raise TypeError(f"{fn}: pad_id={pad_id!r} must be an int label id or None.")
    vocab = logits.shape[-1]
    is_pad = jnp.zeros(labels.shape, jnp.bool_) if pad_id is None else labels == pad_id
    if is_concrete(labels):
        values = np.asarray(labels)
        pads = np.zeros(values.shape, bool) if pad_id is None else values == pad_id
        _check_label_range(fn, values, pads, vocab, pad_id)
    else:
        runtime_check(
            debug_checks,
            is_pad | ((labels >= 0) & (labels < vocab)),
            f"{fn}: labels hold [{{low}}, {{high}}] where not pad_id={pad_id}, outside the "
            f"classes [0, V={vocab}); fix the labels, or check the tokenizer's vocab_size "
            "against the model's.",
            low=jnp.where(is_pad, jnp.iinfo(labels.dtype).max, labels).min(),
            high=jnp.where(is_pad, jnp.iinfo(labels.dtype).min, labels).max(),
        )
    logits = logits.astype(jnp.float32)
    if pad_id is not None:
        # Padded positions are replaced, not multiplied by zero: a NaN or inf logit there
        # gives loss 0 and gradient 0, not NaN.
        logits = jnp.where(is_pad[..., None], 0.0, logits)
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    # Out-of-range labels (possible only under jit) read NaN rather than wrap around: -1
    # would otherwise pick class V-1, as numpy indexing does.
    in_range = (labels >= 0) & (labels < vocab)
    safe_labels = jnp.where(in_range, labels, 0)
    picked = jnp.take_along_axis(log_probs, safe_labels[..., None], axis=-1)[..., 0]
    nll = -jnp.where(in_range, picked, jnp.nan)
    loss = nll
    if label_smoothing:
        uniform = -jnp.mean(log_probs, axis=-1)
        loss = (1.0 - label_smoothing) * nll + label_smoothing * uniform
    weights = (~is_pad).astype(jnp.float32)
    return jnp.where(is_pad, 0.0, loss), weights


def _check_label_range(fn, labels, is_pad, vocab: int, pad_id) -> None:
    bad = np.argwhere(((labels < 0) | (labels >= vocab)) & ~is_pad)
    if bad.size:
        where = tuple(int(i) for i in bad[0])
        raise ValueError(
            f"{fn}: labels hold {labels[where]} at {where}, outside the classes [0, V={vocab}) "
            f"and not pad_id={pad_id}; fix the labels, or pass the id that marks ignored "
            "positions as pad_id (e.g. pad_id=-100 for torch's ignore index)."
        )
