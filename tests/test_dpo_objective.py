"""The preference objectives (`train.tasks.dpo.objective`) as pure functions: hand-checked
small cases, and the loss of a policy equal to its reference; and the replies'
log-probabilities through a tiny model's head in blocks (`train.tasks.dpo.logps`) equal to
`sequence_logps` of its whole logits."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from flax_transformer import DecoderOnlyTransformer, TransformerConfig
from train.tasks.common.objective import LossSetup
from train.tasks.dpo.logps import pair_logps
from train.tasks.dpo.objective import (
    LN2,
    PreferenceLoss,
    pair_losses,
    preference_objective,
    sequence_logps,
)

PAD = 9


def _log_softmax(row):
    row = np.asarray(row, np.float64)
    return row - np.log(np.exp(row).sum())


def test_sequence_logps_sums_the_scored_labels_only():
    logits = np.array(
        [[[1.0, 2.0, 0.5], [0.0, 0.0, 3.0], [2.0, 1.0, 1.0]]], np.float32
    )  # (1, 3, 3)
    labels = np.array([[1, PAD, 0]])
    logps, tokens, logit_sums = sequence_logps(jnp.asarray(logits), jnp.asarray(labels), PAD)
    want = _log_softmax(logits[0, 0])[1] + _log_softmax(logits[0, 2])[0]
    np.testing.assert_allclose(logps, [want], rtol=1e-6)
    np.testing.assert_array_equal(tokens, [2.0])
    np.testing.assert_allclose(logit_sums, [logits[0, 0].mean() + logits[0, 2].mean()], rtol=1e-6)


def test_sequence_logps_leaves_the_added_pad_logit_out():
    # Vocabulary of 3 ids plus the pad id 3 added after it: its logit is no class.
    logits = np.array([[[1.0, 2.0, 0.5, 50.0]]], np.float32)
    logps, _, logit_sums = sequence_logps(
        jnp.asarray(logits), jnp.asarray([[2]]), 3, drop_pad_logit=True
    )
    np.testing.assert_allclose(logps, [_log_softmax(logits[0, 0, :3])[2]], rtol=1e-6)
    np.testing.assert_allclose(logit_sums, [logits[0, 0, :3].mean()], rtol=1e-6)


@pytest.mark.parametrize("loss_type", ["sigmoid", "ipo"])
def test_policy_equal_to_reference(loss_type):
    logps_c, logps_r = jnp.array([-3.0, -7.5]), jnp.array([-4.0, -2.0])
    tokens = jnp.array([3.0, 5.0])
    objective = PreferenceLoss(loss_type, beta=0.25)
    loss, chosen, rejected = pair_losses(
        objective, logps_c, logps_r, logps_c, logps_r, tokens, tokens
    )
    # Every reward is 0; the sigmoid loss is ln 2, IPO's the squared margin (1 / (2 beta))^2.
    np.testing.assert_array_equal(chosen, 0.0)
    np.testing.assert_array_equal(rejected, 0.0)
    want = LN2 if loss_type == "sigmoid" else (1 / (2 * 0.25)) ** 2
    np.testing.assert_allclose(loss, [want, want], rtol=1e-6)


def test_sigmoid_hand_checked_with_label_smoothing():
    # delta = (-1 - -2) - (-3 - -2.5) = 1.5; beta 0.5 -> margin 0.75.
    args = (jnp.array([-1.0]), jnp.array([-3.0]), jnp.array([-2.0]), jnp.array([-2.5]))
    tokens = (jnp.array([2.0]), jnp.array([4.0]))
    sigmoid = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    plain, rc, rr = pair_losses(PreferenceLoss("sigmoid", beta=0.5), *args, *tokens)
    np.testing.assert_allclose(plain, [-math.log(sigmoid(0.75))], rtol=1e-6)
    np.testing.assert_allclose(rc, [0.5], rtol=1e-6)
    np.testing.assert_allclose(rr, [-0.25], rtol=1e-6)
    smooth, _, _ = pair_losses(
        PreferenceLoss("sigmoid", beta=0.5, label_smoothing=0.2), *args, *tokens
    )
    want = -0.8 * math.log(sigmoid(0.75)) - 0.2 * math.log(sigmoid(-0.75))
    np.testing.assert_allclose(smooth, [want], rtol=1e-6)


def test_ipo_hand_checked():
    # ratios 1.0 and -0.5 over 2 and 4 tokens: 0.5 - (-0.125) = 0.625; beta 0.5 -> (0.625 - 1)^2.
    loss, _, _ = pair_losses(
        PreferenceLoss("ipo", beta=0.5),
        jnp.array([-1.0]),
        jnp.array([-3.0]),
        jnp.array([-2.0]),
        jnp.array([-2.5]),
        jnp.array([2.0]),
        jnp.array([4.0]),
    )
    np.testing.assert_allclose(loss, [(0.625 - 1.0) ** 2], rtol=1e-6)


def test_simpo_hand_checked_needs_no_reference():
    # averages -1/2 and -3/4 tokens: beta 2 -> 2 * 0.25 - gamma 0.3 = 0.2.
    loss, rc, rr = pair_losses(
        PreferenceLoss("simpo", beta=2.0, simpo_gamma=0.3),
        jnp.array([-1.0]),
        jnp.array([-3.0]),
        None,
        None,
        jnp.array([2.0]),
        jnp.array([4.0]),
    )
    np.testing.assert_allclose(loss, [math.log(1 + math.exp(-0.2))], rtol=1e-6)
    np.testing.assert_allclose(rc, [-1.0], rtol=1e-6)
    np.testing.assert_allclose(rr, [-1.5], rtol=1e-6)


def test_sums_skip_padding_rows_and_count_pairs():
    chosen = (jnp.array([-1.0, -2.0, 0.0]), jnp.array([2.0, 1.0, 0.0]), jnp.array([4.0, 1.0, 0.0]))
    rejected = (
        jnp.array([-3.0, -1.0, 0.0]),
        jnp.array([3.0, 1.0, 0.0]),
        jnp.array([3.0, 2.0, 0.0]),
    )
    reference = (jnp.array([-1.5, -1.5, 0.0]), jnp.array([-2.0, -1.5, 0.0]))
    objective = PreferenceLoss("sigmoid", beta=1.0)
    mean, sums = preference_objective(objective, chosen, rejected, reference)
    # rewards: chosen 0.5, -0.5; rejected -1.0, 0.5 -> margins 1.5, -1.0; one win of 2 pairs.
    np.testing.assert_allclose(sums["tokens"], 2.0)
    np.testing.assert_allclose(sums["rewards/chosen"], 0.0, atol=1e-7)
    np.testing.assert_allclose(sums["rewards/rejected"], -0.5, rtol=1e-6)
    np.testing.assert_allclose(sums["rewards/margins"], 0.5, rtol=1e-6)
    np.testing.assert_allclose(sums["rewards/accuracies"], 1.0)
    np.testing.assert_allclose(sums["correct"], 1.0)
    np.testing.assert_allclose(sums["logps/chosen"], -3.0, rtol=1e-6)
    np.testing.assert_allclose(sums["reply_tokens"], 7.0)
    want = (math.log(1 + math.exp(-1.5)) + math.log(1 + math.exp(1.0))) / 2
    np.testing.assert_allclose(mean, want, rtol=1e-6)
    np.testing.assert_allclose(sums["loss"], 2 * want, rtol=1e-6)
    # logits/*: the batch's mean per scored token (5 / 3), times the 2 pairs.
    np.testing.assert_allclose(sums["logits/chosen"], 2 * 5.0 / 3.0, rtol=1e-6)


def test_loss_of_a_model_equal_to_its_reference_is_ln2_with_a_gradient():
    # Through sequence_logps: the gradient of the sigmoid loss at equality is nonzero.
    key = jax.random.key(0)
    logits = jax.random.normal(key, (4, 5, 7))
    labels = jnp.array([[1, 2, PAD, PAD, PAD]] * 4)
    objective = PreferenceLoss()

    def loss(logits):
        chosen = sequence_logps(logits[:2], labels[:2], PAD)
        rejected = sequence_logps(logits[2:], labels[2:], PAD)
        ref = (jax.lax.stop_gradient(chosen[0]), jax.lax.stop_gradient(rejected[0]))
        return preference_objective(objective, chosen, rejected, ref)[0]

    value, grad = jax.value_and_grad(loss)(logits)
    np.testing.assert_allclose(value, LN2, rtol=1e-6)
    assert float(jnp.abs(grad).sum()) > 0


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"beta": 0.0}, "tasks.dpo.beta"),
        ({"beta": -1.0}, "tasks.dpo.beta"),
        ({"loss_type": "hinge"}, "tasks.dpo.loss"),
        ({"label_smoothing": 0.5}, "tasks.dpo.label_smoothing"),
        ({"loss_type": "ipo", "label_smoothing": 0.1}, "tasks.dpo.label_smoothing"),
        ({"simpo_gamma": -0.1}, "tasks.dpo.simpo_gamma"),
    ],
)
def test_bad_options_name_their_field(kwargs, field):
    with pytest.raises(ValueError, match=f"--config.{field}="):
        PreferenceLoss(**kwargs)


def test_a_tasks_own_sums_pass_through_the_loop_summaries():
    # The loop names no task's metric: any sum beside the token sums is a mean per 'tokens'.
    from train.program.metrics.summaries import evaluate_loss, summarize

    step = {"loss": 1.4, "nll": 1.4, "correct": 1.0, "tokens": 2.0, "rewards/margins": 0.6}
    summary = summarize(step)
    assert summary["rewards/margins"] == pytest.approx(0.3)
    assert summary["loss"] == pytest.approx(0.7)
    valid = evaluate_loss(lambda params, batch: batch, None, [step, step], lambda b: b)
    assert valid["rewards/margins"] == pytest.approx(0.3) and valid["tokens"] == 4


# The policy's and the reference's sums through the head in blocks (`train.tasks.dpo.logps`).

# 2 pairs (4 rows) x 7 positions in blocks of 8 rows: 2 positions of the 4 rows a step, the
# last block padded; 28 rows: one block, no scan.
PAIR_VOCAB, PAIR_LENGTH = 29, 7


@pytest.mark.parametrize("block_rows", [8, 28])
@pytest.mark.parametrize("drop_pad_logit", [False, True])
def test_pair_logps_through_the_head_in_blocks_equal_whole_logits(block_rows, drop_pad_logit):
    # The added pad id is the last id when its logit is left out, else id 0.
    pad = PAIR_VOCAB - 1 if drop_pad_logit else 0
    config = TransformerConfig(
        vocab_size=PAIR_VOCAB,
        d_model=16,
        num_heads=2,
        d_ff=32,
        num_layers=1,
        max_len=16,
        dropout_rate=0.0,
        pad_id=pad,
        tie_output_embedding=False,
        output_bias=True,
        logits_soft_cap=4.0,
    )
    model = DecoderOnlyTransformer(config)
    rng = np.random.default_rng(0)
    batch = {}
    for side in ("chosen", "rejected"):
        tokens = rng.integers(1, PAIR_VOCAB - 1, (2, PAIR_LENGTH))
        labels = np.roll(tokens, -1, axis=1)
        labels[:, :2] = pad  # the prompt
        labels[:, -1] = pad
        labels[1, -3:] = pad  # padding
        batch[side], batch[f"{side}_labels"] = jnp.asarray(tokens), jnp.asarray(labels)
    params = nn.unbox(model.init(jax.random.key(0), batch["chosen"]))["params"]
    # A head and bias far from init: the bias and the cap matter.
    params = jax.tree.map(lambda x: x + 0.3 * jax.random.normal(jax.random.key(1), x.shape), params)
    setup = LossSetup(pad, drop_pad_logit=drop_pad_logit, block_rows=block_rows)

    def whole(params):
        inputs = jnp.concatenate([batch["chosen"], batch["rejected"]])
        labels = jnp.concatenate([batch["chosen_labels"], batch["rejected_labels"]])
        both = sequence_logps(
            model.apply({"params": params}, inputs), labels, pad, drop_pad_logit=drop_pad_logit
        )
        return tuple(x[:2] for x in both), tuple(x[2:] for x in both)

    def blocked(params):
        return pair_logps(model, params, batch, setup, deterministic=True)

    def objective(logps):
        def f(params):
            (logps_c, _, _), (logps_r, _, _) = logps(params)
            return (jnp.asarray([1.0, -2.0]) * logps_c).sum() + (3.0 * logps_r).sum()

        return f

    want, got = whole(params), jax.jit(blocked)(params)
    for side, w_side, g_side in zip(("chosen", "rejected"), want, got, strict=True):
        for name, w, g in zip(("logps", "tokens", "logit sums"), w_side, g_side, strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5, err_msg=f"{side} {name}")
    np.testing.assert_array_equal(got[0][1], [PAIR_LENGTH - 3, PAIR_LENGTH - 5])
    want_grads = jax.grad(objective(whole))(params)
    got_grads = jax.jit(jax.grad(objective(blocked)))(params)
    jax.tree.map(
        lambda w, g: np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5), want_grads, got_grads
    )
