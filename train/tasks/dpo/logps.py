"""The log-probability of a batch's chosen and rejected replies, both rows in one forward
pass, through the model's head in blocks: the policy's in the loss, the reference's
(`reference.py`) before step 1 or, with adapters off, at every step.

The model gives its final hidden states (`hidden_states`), not its logits, and
`flax_transformer.functional.blocked_label_logps` applies the head (`output_head`) a block of
positions at a time, summing each row's scored labels: the `(2B, L, V)` logits, the largest
array of the step at a 49,152-id vocabulary, are never held whole, forward or backward
(benchmarks/RESULTS.md). `objective.sequence_logps` computes the same sums from whole
logits (the tests compare the two).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from flax_transformer.functional import blocked_label_logps
from train.tasks.common.objective import LossSetup

# (log p of the scored labels, scored tokens, mean-logit sums), each `(B,)` float32: the
# order of `objective.sequence_logps`, which `objective.preference_objective` reads.
Logps = tuple[jax.Array, jax.Array, jax.Array]


def pair_logps(
    model, params, batch, setup: LossSetup, *, deterministic: bool, rngs=None
) -> tuple[Logps, Logps]:
    """The chosen and the rejected rows' sums, as `objective.sequence_logps` of the logits.

    Args:
        model: the language model (`hidden_states` and `output_head`).
        params: its parameters.
        batch: `chosen`, `rejected` `(B, L)` int ids and their `_labels` `(B, L)`, the pad id
            wherever a position is not scored.
        setup: the pad id, whether its logit is left out (`drop_pad_logit`) and the rows a
            block of the head takes (`block_rows`).
        deterministic: no dropout; `rngs`: the dropout key otherwise.

    Returns:
        (the chosen rows', the rejected rows') (logps, tokens, logit sums), `(B,)` each.
    """
    rows = batch["chosen"].shape[0]
    inputs_BL = jnp.concatenate([batch["chosen"], batch["rejected"]])
    labels_BL = jnp.concatenate([batch["chosen_labels"], batch["rejected_labels"]])
    hidden_BLD = model.apply(
        {"params": params},
        inputs_BL,
        deterministic=deterministic,
        rngs=rngs,
        method=model.hidden_states,
    )
    kernel_DV, bias_V = model.output_head({"params": params})
    sums = blocked_label_logps(
        hidden_BLD,
        kernel_DV,
        labels_BL,
        (labels_BL != setup.pad_id).astype(jnp.float32),
        block_rows=setup.block_rows,
        num_scored_ids=setup.pad_id if setup.drop_pad_logit else None,
        bias_V=bias_V,
        logits_soft_cap=model.config.logits_soft_cap,
        dtype=model.config.dtype,
    )
    both = (sums["logps"], sums["tokens"], sums["mean_logits"])
    return tuple(x[:rows] for x in both), tuple(x[rows:] for x in both)
