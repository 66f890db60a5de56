"""The train step's pieces that are not the model: target-side word dropout."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from train import tasks
from train.program import steps
from train.tasks import TASKS

TRANSLATION = TASKS["translation"]

PAD, UNK = 0, 3


def _targets(rows=64, length=40, seed=0):
    rng = np.random.default_rng(seed)
    tgt_in = rng.integers(4, 100, size=(rows, length)).astype(np.int32)
    tgt_in[:, 0] = 1  # BOS
    lengths = rng.integers(2, length + 1, size=rows)
    tgt_in[np.arange(length)[None, :] >= lengths[:, None]] = PAD
    return jnp.asarray(tgt_in)


def test_word_dropout_rate_zero_is_identity():
    tgt_in = _targets()
    out = tasks.drop_target_tokens(tgt_in, 0.0, jax.random.key(0), unk_id=UNK, pad_id=PAD)
    np.testing.assert_array_equal(out, tgt_in)


@pytest.mark.parametrize("rate", [0.2, 0.5])
def test_word_dropout_replaces_that_share_and_keeps_bos_and_padding(rate):
    tgt_in = _targets()
    out = np.asarray(
        tasks.drop_target_tokens(tgt_in, rate, jax.random.key(1), unk_id=UNK, pad_id=PAD)
    )
    tgt_in = np.asarray(tgt_in)
    np.testing.assert_array_equal(out[:, 0], tgt_in[:, 0])  # BOS stays
    np.testing.assert_array_equal(out == PAD, tgt_in == PAD)  # padding stays padding
    changed = out != tgt_in
    assert set(np.unique(out[changed])) == {UNK}
    eligible = (tgt_in != PAD) & (np.arange(tgt_in.shape[1]) > 0)
    share = changed.sum() / eligible.sum()
    assert share == pytest.approx(rate, abs=0.03)  # ~1,200 eligible tokens


@pytest.mark.slow  # three train steps compiled
def test_word_dropout_changes_training_only_when_on():
    """A rate > 0 changes the loss (the decoder sees <unk> inputs) but not the labels."""
    import optax

    from flax_transformer import Transformer, TransformerConfig
    from flax_transformer import sharding as sharding_lib

    model = Transformer(
        TransformerConfig(vocab_size=100, d_model=16, num_heads=2, d_ff=32, num_layers=1)
    )
    tx = optax.adam(1e-3)
    mesh = sharding_lib.make_mesh(data=-1)
    tgt = _targets(rows=4, length=12)
    batch = {"src": tgt, "tgt_in": tgt, "tgt_out": jnp.roll(tgt, -1, axis=1)}

    def run(rate):
        state = steps.create_train_state(model, TRANSLATION, tx, mesh, 0, "threefry2x32")
        # Jitted: op by op, the step would compile hundreds of small programs.
        step = jax.jit(
            functools.partial(
                steps.train_step,
                model=model,
                task=TRANSLATION,
                tx=tx,
                label_smoothing=0.0,
                rng_impl="threefry2x32",
                target_token_dropout=rate,
            )
        )
        _, metrics = step(state, batch)
        return metrics

    off, on = run(0.0), run(0.5)
    assert off["tokens"] == on["tokens"]
    assert float(off["loss"]) != float(on["loss"])
