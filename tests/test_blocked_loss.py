"""The head and its loss in blocks of rows (`functional.blocked_cross_entropy`).

Equal to the plain path (the model's full logits, then `label_smoothed_cross_entropy`) to
float32 rounding, values and gradients: label smoothing, padding, tied and untied heads
(with a bias and a logit soft-cap), ids left out (`num_scored_ids`), a row count that the
block does not divide. That no `(N, V)` buffer is left is measured in
benchmarks/blocked_loss_memory.py (compiled temp bytes), not here.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from flax_transformer import DecoderOnlyTransformer, Transformer, TransformerConfig
from flax_transformer.functional import blocked_cross_entropy, label_smoothed_cross_entropy

PAD = 0
VOCAB = 37


def _config(**changes):
    base = dict(vocab_size=VOCAB, d_model=16, num_heads=2, d_ff=32, num_layers=1, max_len=16)
    return TransformerConfig(**base, dropout_rate=0.0).replace(**changes)


def _batch(seed=0, batch=3, length=9):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, VOCAB, (batch, length))
    tokens[0, -4:] = PAD
    labels = np.roll(tokens, -1, axis=1)
    labels[:, -1] = PAD
    labels[tokens == PAD] = PAD
    return jnp.asarray(tokens, jnp.int32), jnp.asarray(labels, jnp.int32)


def _plain_sums(logits, labels, smoothing, scored):
    logits = logits[..., :scored]
    loss, weights = label_smoothed_cross_entropy(
        logits, labels, label_smoothing=smoothing, pad_id=PAD
    )
    nll, _ = label_smoothed_cross_entropy(logits, labels, pad_id=PAD)
    correct = (jnp.argmax(logits, -1) == labels) * weights
    return {
        "loss": loss.sum(),
        "nll": nll.sum(),
        "correct": correct.sum(),
        "tokens": weights.sum(),
    }


def _blocked_sums(model, params, hidden_BTD, labels, smoothing, scored, block_rows):
    kernel_DV, bias_V = model.output_head(params)
    return blocked_cross_entropy(
        hidden_BTD,
        kernel_DV,
        labels,
        (labels != PAD).astype(jnp.float32),
        block_rows=block_rows,
        label_smoothing=smoothing,
        num_scored_ids=scored,
        bias_V=bias_V,
        logits_soft_cap=model.config.logits_soft_cap,
        dtype=model.config.dtype,
    )


CASES = {
    "tied": ({}, 0.0, None),
    "tied_smoothed": ({}, 0.1, None),
    "untied_bias_cap": (
        dict(tie_output_embedding=False, output_bias=True, logits_soft_cap=5.0),
        0.1,
        None,
    ),
    "scored_ids": (dict(tie_output_embedding=False), 0.1, VOCAB - 1),
}


# 3 rows x 9 positions in blocks of 6 rows, 2 positions (the last block padded); or all 27
# rows in one block (no scan, no recomputation).
@pytest.mark.parametrize(
    "case, block_rows", [(case, 6) for case in sorted(CASES)] + [("untied_bias_cap", 27)]
)
def test_decoder_only_blocked_equals_plain_values_and_gradients(case, block_rows):
    changes, smoothing, scored = CASES[case]
    model = DecoderOnlyTransformer(_config(**changes))
    tokens, labels = _batch()
    params = nn.unbox(model.init(jax.random.key(0), tokens))
    # Nonzero biases and a head far from init: the bias and the cap matter.
    params = jax.tree.map(lambda x: x + 0.3 * jax.random.normal(jax.random.key(1), x.shape), params)

    def plain(p):
        sums = _plain_sums(model.apply(p, tokens), labels, smoothing, scored)
        return sums["loss"], sums

    def blocked(p):
        hidden = model.apply(p, tokens, method=model.hidden_states)
        sums = _blocked_sums(model, p, hidden, labels, smoothing, scored, block_rows)
        return sums["loss"], sums

    (_, want), want_grads = jax.value_and_grad(plain, has_aux=True)(params)
    (_, got), got_grads = jax.jit(jax.value_and_grad(blocked, has_aux=True))(params)
    # 3 rows x 9: row 0 scores 4 labels (its last 4 tokens are padding), rows 1-2 all but the last.
    assert float(want["tokens"]) == 4 + 8 + 8
    for name in ("loss", "nll", "correct", "tokens"):
        np.testing.assert_allclose(float(got[name]), float(want[name]), rtol=1e-5, err_msg=name)
    flat_want = jax.tree_util.tree_leaves_with_path(want_grads)
    flat_got = dict(jax.tree_util.tree_leaves_with_path(got_grads))
    for path, g in flat_want:
        scale = float(jnp.abs(g).max()) or 1.0
        np.testing.assert_allclose(
            np.asarray(flat_got[path]) / scale, np.asarray(g) / scale, atol=2e-6, err_msg=str(path)
        )


def test_encoder_decoder_untied_head_blocked_equals_plain():
    model = Transformer(_config(share_embeddings=False, tie_output_embedding=True))
    src, _ = _batch(seed=1)
    tgt, labels = _batch(seed=2)
    params = nn.unbox(model.init(jax.random.key(0), src, tgt))

    def plain(p):
        return _plain_sums(model.apply(p, src, tgt), labels, 0.1, None)["loss"]

    def blocked(p):
        hidden = model.apply(p, src, tgt, method=model.hidden_states)
        return _blocked_sums(model, p, hidden, labels, 0.1, None, block_rows=8)["loss"]

    want, want_grads = jax.value_and_grad(plain)(params)
    got, got_grads = jax.value_and_grad(blocked)(params)
    np.testing.assert_allclose(float(got), float(want), rtol=1e-5)
    # The target embedding is the head: its gradient comes through both uses.
    g_want = want_grads["params"]["target_embed"]["embedding"]
    g_got = got_grads["params"]["target_embed"]["embedding"]
    np.testing.assert_allclose(g_got, g_want, atol=2e-6 * float(jnp.abs(g_want).max()))


def test_hidden_states_skip_the_head_without_tripping_the_unused_params_check():
    model = DecoderOnlyTransformer(_config(tie_output_embedding=False, output_bias=True))
    tokens, _ = _batch()
    params = nn.unbox(model.init(jax.random.key(0), tokens))
    hidden = model.apply(params, tokens, method=model.hidden_states)
    assert hidden.shape == (*tokens.shape, 16)
    kernel, bias = model.output_head(params)
    assert kernel.shape == (16, VOCAB) and bias.shape == (VOCAB,)
    logits = model.apply(params, tokens)
    np.testing.assert_allclose(
        logits, jnp.einsum("btd,dv->btv", hidden, kernel) + bias, rtol=1e-5, atol=1e-6
    )
    # A tree with an entry the config does not use is still refused on this path.
    extra = {"params": {**params["params"], "stray": {"kernel": jnp.zeros((2,))}}}
    with pytest.raises(ValueError, match="does not use"):
        model.apply(extra, tokens, method=model.hidden_states)


def test_scored_label_outside_the_scored_ids_is_nan_and_padding_is_free():
    hidden = jnp.ones((1, 4, 3))
    head = jnp.ones((3, 5))
    labels = jnp.asarray([[1, 4, 2, 99]])  # 4 is outside 4 scored ids; 99 sits on padding
    weights = jnp.asarray([[1.0, 1.0, 1.0, 0.0]])
    sums = blocked_cross_entropy(hidden, head, labels, weights, num_scored_ids=4)
    assert np.isnan(float(sums["loss"]))
    ok = blocked_cross_entropy(hidden, head, labels.at[0, 1].set(0), weights, num_scored_ids=4)
    np.testing.assert_allclose(float(ok["nll"]), 3 * np.log(4.0), rtol=1e-6)
    assert float(ok["tokens"]) == 3.0


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(block_rows=0), "block_rows"),
        (dict(label_smoothing=1.0), "label_smoothing"),
        (dict(num_scored_ids=6), "num_scored_ids=6 exceeds"),
        (dict(bias_V=jnp.zeros(4)), "bias_V"),
    ],
)
def test_bad_arguments_are_refused_by_name(kwargs, match):
    with pytest.raises(ValueError, match=match):
        blocked_cross_entropy(
            jnp.ones((1, 4, 3)),
            jnp.ones((3, 5)),
            jnp.zeros((1, 4), jnp.int32),
            jnp.ones((1, 4)),
            **kwargs,
        )
    with pytest.raises(ValueError, match="hidden_BTD must be"):
        blocked_cross_entropy(jnp.ones((4, 3)), jnp.ones((3, 5)), jnp.zeros(4, int), jnp.ones(4))
    with pytest.raises(ValueError, match="labels_BT and weights_BT must be"):
        blocked_cross_entropy(
            jnp.ones((1, 4, 3)), jnp.ones((3, 5)), jnp.zeros(4, int), jnp.ones((1, 4))
        )
