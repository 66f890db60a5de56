"""Preference objectives as pure functions of arrays: DPO's sigmoid loss (with conservative
DPO's label smoothing), IPO, and SimPO (reference-free), and the metric sums a step reports
under TRL's names.

Shapes: B pairs, L positions, V vocabulary. A pair's chosen and rejected replies are two rows
of one forward pass; their labels are `(B, L)` ids, the pad id wherever a position is not a
scored reply token (the prompt, padding), as the chat task masks them.

The formulas (Rafailov et al. 2023 for DPO; as TRL 1.16 writes them):
    pi_c, pi_r     policy log-probabilities of the chosen / rejected reply, summed over
                   its scored tokens (`sequence_logps`)
    ref_c, ref_r   the same under the reference (the starting weights)
    delta          (pi_c - ref_c) - (pi_r - ref_r)
    sigmoid        -(1 - eps) log sigmoid(beta delta) - eps log sigmoid(-beta delta)
                   (eps = label_smoothing: conservative DPO, Mitchell 2023; eps = 0 is DPO
                   and TRL's 'sigmoid')
    ipo            (delta_c / n_c - delta_r / n_r - 1 / (2 beta))^2 with n the reply's scored
                   tokens (Azar et al. 2023, eq. 17, length-normalised as TRL's 'ipo')
    simpo          -(1 - eps) log sigmoid(m) - eps log sigmoid(-m),
                   m = beta (pi_c / n_c - pi_r / n_r) - gamma (Meng et al. 2024; no
                   reference)
Rewards (what `rewards/*` report): beta (pi - ref) for sigmoid and ipo, as TRL logs them;
beta pi / n for SimPO, its implicit reward.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

# `--config.tasks.dpo.loss` values, and whether each compares with a reference.
LOSS_TYPES = ("sigmoid", "ipo", "simpo")
NEEDS_REFERENCE = {"sigmoid": True, "ipo": True, "simpo": False}

# The metrics a pair contributes, as sums over the batch's pairs (TRL's names); the loop
# divides each by the pairs counted ('tokens' of the sums: the objective's unit is a pair).
PAIR_METRICS = (
    "rewards/chosen",
    "rewards/rejected",
    "rewards/accuracies",
    "rewards/margins",
    "logps/chosen",
    "logps/rejected",
    "logits/chosen",
    "logits/rejected",
)

# The loss of a pair whose policy equals its reference under the sigmoid loss: -log(1/2).
LN2 = math.log(2.0)


@dataclasses.dataclass(frozen=True)
class PreferenceLoss:
    """Which preference objective, and its constants.

    Attributes:
        loss_type: 'sigmoid' (DPO), 'ipo' or 'simpo' (`LOSS_TYPES`).
        beta: the inverse temperature of the implicit reward (> 0); IPO's 1 / (2 tau) margin
            uses it as its tau.
        label_smoothing: the probability that a preference label is flipped, in [0, 0.5)
            (conservative DPO; SimPO's too); IPO has none.
        simpo_gamma: SimPO's target margin gamma (its paper's gamma; >= 0).
    """

    loss_type: str = "sigmoid"
    beta: float = 0.1
    label_smoothing: float = 0.0
    simpo_gamma: float = 0.5

    def __post_init__(self):
        if self.loss_type not in LOSS_TYPES:
            raise ValueError(
                f"--config.tasks.dpo.loss={self.loss_type!r}: must be one of {LOSS_TYPES}."
            )
        if not (isinstance(self.beta, (int, float)) and self.beta > 0 and math.isfinite(self.beta)):
            raise ValueError(f"--config.tasks.dpo.beta={self.beta!r}: must be a finite number > 0.")
        if not 0.0 <= self.label_smoothing < 0.5:
            raise ValueError(
                f"--config.tasks.dpo.label_smoothing={self.label_smoothing!r}: must be in [0, 0.5) "
                "(the probability that a preference label is flipped)."
            )
        if self.loss_type == "ipo" and self.label_smoothing:
            raise ValueError(
                f"--config.tasks.dpo.label_smoothing={self.label_smoothing!r}: IPO has no label "
                "smoothing; set it to 0 or use --config.tasks.dpo.loss=sigmoid."
            )
        if not self.simpo_gamma >= 0:
            raise ValueError(f"--config.tasks.dpo.simpo_gamma={self.simpo_gamma!r}: must be >= 0.")

    @property
    def needs_reference(self) -> bool:
        return NEEDS_REFERENCE[self.loss_type]


def sequence_logps(
    logits_BLV: jax.Array, labels_BL: jax.Array, pad_id: int, *, drop_pad_logit: bool = False
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Per-row log-probability of the scored labels, summed, and what the metrics need.

    From whole logits: the task computes the same sums through the head in blocks
    (`train.tasks.dpo.logps.pair_logps`), without them; this is the form the tests compare
    it with.

    Args:
        logits_BLV: the model's logits (any float dtype; computed in float32).
        labels_BL: int ids; `pad_id` where a position is not scored.
        pad_id: the unscored id.
        drop_pad_logit: the pad id is an id added after the checkpoint's V ids (the last):
            its logit is left out of the softmax and the mean logit, so the numbers are the
            checkpoint's own.

    Returns:
        (logps_B: sum over scored positions of log p(label), float32;
         tokens_B: scored positions, float32;
         logit_sums_B: sum over scored positions of the mean logit over the vocabulary,
         float32, without gradient: TRL's `logits/*` numerator).
    """
    logits_BLV = logits_BLV.astype(jnp.float32)
    if drop_pad_logit:
        logits_BLV = logits_BLV[..., :pad_id]
    scored_BL = labels_BL != pad_id
    safe_BL = jnp.where(scored_BL, labels_BL, 0)
    picked_BL = jnp.take_along_axis(logits_BLV, safe_BL[..., None], axis=-1)[..., 0]
    logp_BL = picked_BL - jax.nn.logsumexp(logits_BLV, axis=-1)
    weights_BL = scored_BL.astype(jnp.float32)
    mean_logit_BL = jax.lax.stop_gradient(logits_BLV.mean(axis=-1))
    return (
        (logp_BL * weights_BL).sum(axis=-1),
        weights_BL.sum(axis=-1),
        (mean_logit_BL * weights_BL).sum(axis=-1),
    )


def _smoothed_sigmoid_loss(margin_B: jax.Array, label_smoothing: float) -> jax.Array:
    loss_B = -jax.nn.log_sigmoid(margin_B)
    if label_smoothing:
        loss_B = (1.0 - label_smoothing) * loss_B - label_smoothing * jax.nn.log_sigmoid(-margin_B)
    return loss_B


def pair_losses(
    objective: PreferenceLoss,
    logps_c_B: jax.Array,
    logps_r_B: jax.Array,
    ref_c_B: jax.Array | None,
    ref_r_B: jax.Array | None,
    tokens_c_B: jax.Array,
    tokens_r_B: jax.Array,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Each pair's loss and its replies' rewards.

    Args:
        objective: which loss.
        logps_c_B, logps_r_B: policy log-probabilities of the chosen / rejected replies.
        ref_c_B, ref_r_B: the reference's; None for a reference-free loss.
        tokens_c_B, tokens_r_B: each reply's scored tokens.

    Returns:
        (loss_B, chosen rewards_B, rejected rewards_B), float32.

    Raises:
        ValueError: a loss that needs a reference given none.
    """
    beta = objective.beta
    if objective.loss_type == "simpo":
        avg_c_B = logps_c_B / jnp.maximum(tokens_c_B, 1.0)
        avg_r_B = logps_r_B / jnp.maximum(tokens_r_B, 1.0)
        margin_B = beta * (avg_c_B - avg_r_B) - objective.simpo_gamma
        loss_B = _smoothed_sigmoid_loss(margin_B, objective.label_smoothing)
        return loss_B, beta * jax.lax.stop_gradient(avg_c_B), beta * jax.lax.stop_gradient(avg_r_B)
    if ref_c_B is None or ref_r_B is None:
        raise ValueError(
            f"tasks.dpo.loss={objective.loss_type!r} compares with a reference; none given."
        )
    ratio_c_B = logps_c_B - ref_c_B
    ratio_r_B = logps_r_B - ref_r_B
    if objective.loss_type == "sigmoid":
        loss_B = _smoothed_sigmoid_loss(beta * (ratio_c_B - ratio_r_B), objective.label_smoothing)
    else:  # ipo
        delta_B = ratio_c_B / jnp.maximum(tokens_c_B, 1.0) - ratio_r_B / jnp.maximum(
            tokens_r_B, 1.0
        )
        loss_B = (delta_B - 1.0 / (2.0 * beta)) ** 2
    return loss_B, beta * jax.lax.stop_gradient(ratio_c_B), beta * jax.lax.stop_gradient(ratio_r_B)


def preference_objective(
    objective: PreferenceLoss,
    chosen: tuple[jax.Array, jax.Array, jax.Array],
    rejected: tuple[jax.Array, jax.Array, jax.Array],
    reference: tuple[jax.Array, jax.Array] | None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The mean loss over a batch's pairs and its metric sums.

    A row whose chosen reply has no scored token is padding (a batch's rows past the data)
    and counts nowhere.

    Args:
        objective: which loss.
        chosen, rejected: `sequence_logps` of the chosen / rejected rows, `(B,)` each.
        reference: the reference's (chosen, rejected) log-probabilities `(B,)`, or None.

    Returns:
        (the mean loss over real pairs, as differentiated; sums over real pairs: 'loss' and
        'nll' (the loss), 'correct' (pairs whose chosen reward beats the rejected one),
        'tokens' (pairs: the unit the loop divides by), 'reply_tokens' (scored tokens of
        both replies), and each of `PAIR_METRICS`).
    """
    logps_c_B, tokens_c_B, logit_sums_c_B = chosen
    logps_r_B, tokens_r_B, logit_sums_r_B = rejected
    ref_c_B, ref_r_B = reference if reference is not None else (None, None)
    loss_B, reward_c_B, reward_r_B = pair_losses(
        objective, logps_c_B, logps_r_B, ref_c_B, ref_r_B, tokens_c_B, tokens_r_B
    )
    real_B = (tokens_c_B > 0).astype(jnp.float32)
    pairs = real_B.sum()
    loss_sum = (loss_B * real_B).sum()
    wins_B = (reward_c_B > reward_r_B).astype(jnp.float32) * real_B

    # TRL's logits/* are the batch's mean logit per scored token. Reported as that mean times
    # the pairs, the loop's division by pairs gives it back for one batch (over several, the
    # pair-weighted mean of the batches' means).
    def token_mean_times_pairs(logit_sums_B, tokens_B):
        token_mean = (logit_sums_B * real_B).sum() / jnp.maximum((tokens_B * real_B).sum(), 1.0)
        return token_mean * pairs

    sums = {
        "loss": loss_sum,
        "nll": loss_sum,
        "correct": wins_B.sum(),
        "tokens": pairs,
        "reply_tokens": ((tokens_c_B + tokens_r_B) * real_B).sum(),
        "rewards/chosen": (reward_c_B * real_B).sum(),
        "rewards/rejected": (reward_r_B * real_B).sum(),
        "rewards/accuracies": wins_B.sum(),
        "rewards/margins": ((reward_c_B - reward_r_B) * real_B).sum(),
        "logps/chosen": (jax.lax.stop_gradient(logps_c_B) * real_B).sum(),
        "logps/rejected": (jax.lax.stop_gradient(logps_r_B) * real_B).sum(),
        "logits/chosen": token_mean_times_pairs(logit_sums_c_B, tokens_c_B),
        "logits/rejected": token_mean_times_pairs(logit_sums_r_B, tokens_r_B),
    }
    return loss_sum / jnp.maximum(pairs, 1.0), sums
