"""The tasks' default objective goes through the head in blocks (`head_cross_entropy`,
`head_eval_sums`) and equals the objective of whole logits (`token_cross_entropy`,
`token_eval_sums`) to float32 rounding: loss, gradient and every reported sum, for the
language model and translation, with label smoothing and with the pad logit left out."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flax_transformer import TransformerConfig
from train import tasks
from train.tasks.common.objective import LossSetup, token_cross_entropy, token_eval_sums

VOCAB = 29


def _batch(task_name: str, pad_id: int):
    rng = np.random.default_rng(0)
    tokens = rng.integers(4, VOCAB - 1, (3, 10))
    tokens[0, -3:] = pad_id
    labels = np.roll(tokens, -1, axis=1)
    labels[:, -1] = pad_id
    tokens, labels = jnp.asarray(tokens, jnp.int32), jnp.asarray(labels, jnp.int32)
    if task_name == "translation":
        return {"src": tokens[:, ::-1], "tgt_in": tokens, "tgt_out": labels}
    return {"inputs": tokens, "targets": labels}


CASES = {
    "lm": ("lm", dict(), 0.1, False),
    "lm_untied_pad_logit": ("lm", dict(tie_output_embedding=False), 0.1, True),
    "translation": ("translation", dict(), 0.1, False),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_task_objective_in_blocks_equals_whole_logits(case):
    task_name, changes, smoothing, drop_pad_logit = CASES[case]
    # With the pad logit dropped the pad id is the last id, as an imported model's is.
    pad_id = VOCAB - 1 if drop_pad_logit else 0
    config = TransformerConfig(
        vocab_size=VOCAB,
        d_model=16,
        num_heads=2,
        d_ff=32,
        num_layers=1,
        max_len=16,
        dropout_rate=0.0,
        pad_id=pad_id,
        **changes,
    )
    task = tasks.get_task(task_name)
    model = task.make_model(config)
    params = model.init(jax.random.key(0), *task.init_inputs())["params"]
    batch = _batch(task_name, pad_id)
    # block_rows 6 over 3 rows: 2 positions a step, 5 steps.
    setup = LossSetup(pad_id, smoothing, drop_pad_logit, block_rows=6)

    def blocked(p):
        return task.loss(model, p, batch, setup, deterministic=True)

    def whole(p):
        outputs = task.logits_and_labels(model, p, batch, deterministic=True)
        return token_cross_entropy(*outputs, setup)

    (got, got_sums), got_grads = jax.value_and_grad(blocked, has_aux=True)(params)
    (want, want_sums), want_grads = jax.value_and_grad(whole, has_aux=True)(params)
    np.testing.assert_allclose(float(got), float(want), rtol=1e-5)
    assert got_sums.keys() == want_sums.keys()
    for name in want_sums:
        np.testing.assert_allclose(float(got_sums[name]), float(want_sums[name]), rtol=1e-5)
    for g, w in zip(jax.tree.leaves(got_grads), jax.tree.leaves(want_grads), strict=True):
        scale = float(jnp.abs(w).max()) or 1.0
        np.testing.assert_allclose(np.asarray(g) / scale, np.asarray(w) / scale, atol=2e-6)

    eval_setup = LossSetup(pad_id, 0.0, drop_pad_logit, block_rows=6)
    got_eval = task.eval_sums(model, params, batch, eval_setup)
    outputs = task.logits_and_labels(model, params, batch, deterministic=True)
    want_eval = token_eval_sums(*outputs, eval_setup)
    for name in want_eval:
        np.testing.assert_allclose(float(got_eval[name]), float(want_eval[name]), rtol=1e-5)
