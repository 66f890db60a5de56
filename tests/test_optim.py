"""train.formats.optimizers: the schedule and the optax optimizer built from the checked sections.

The paper's schedule (eq. 3) is pinned on `configs/transformer_base.py` in
tests/test_config_files.py, and the rate each step reports in tests/test_sections.py; here
the builders alone, on small trees.
"""

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import linen as nn
from optax.contrib import MuonDimensionNumbers

from flax_transformer import (
    Transformer,
    TransformerConfig,
    muon_dimension_numbers,
    muon_partition,
)
from train.config.sections import OptimizerConfig, ScheduleConfig
from train.formats import optimizers as optim
from train.formats.optimizers.muon import MuonOptions

PARAMS = {"embed": jnp.full((3,), 0.5), "new": jnp.full((2,), -0.5), "old": jnp.full((2,), 1.0)}
GRADS = {
    "embed": jnp.full((3,), 100.0),
    "new": jnp.array([3.0, -4.0]),
    "old": jnp.array([3.0, -4.0]),
}
GROUPS = {"embed": "frozen", "new": "train", "old": "pretrained"}


def _optimizer(**fields):
    values = dict(name="adamw", b1=0.9, b2=0.98, eps=1e-9, weight_decay=0.0, grad_clip_norm=0.0)
    values.update(grad_accum_steps=1, freeze="", pretrained_lr_scale=1.0)
    values.update(fields)
    return OptimizerConfig(**values)


def _constant(rate: float) -> ScheduleConfig:
    """A schedule at `rate` from the first update (no warm-up)."""
    return ScheduleConfig("constant", rate, warmup_steps=0, num_updates=10)


def _updates(tx, grads=GRADS, params=PARAMS):
    updates, _ = tx.update(grads, tx.init(params), params)
    return jax.tree.map(np.asarray, updates)


@pytest.mark.parametrize(
    "kind, rates",
    [
        ("constant", [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]),
        ("rsqrt", [0.25, 0.5, 0.75, 1.0, (4 / 5) ** 0.5, (4 / 6) ** 0.5]),
        ("cosine", [0.25, 0.5, 0.75, 1.0, 0.5, 0.0]),
    ],
)
def test_each_schedule_warms_up_linearly_from_the_first_update(kind, rates):
    schedule = optim.make_schedule(ScheduleConfig(kind, 1.0, warmup_steps=4, num_updates=6))
    got = [float(schedule(count)) for count in range(6)]
    np.testing.assert_allclose(got, rates, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("kind", ["adam", "adamw"])
def test_without_groups_it_is_clipping_then_the_named_rule(kind):
    section = _optimizer(name=kind, weight_decay=0.1, grad_clip_norm=1.0)
    rule = optax.adamw(1e-3, 0.9, 0.98, 1e-9, weight_decay=0.1) if kind == "adamw" else None
    rule = rule or optax.adam(1e-3, 0.9, 0.98, 1e-9)
    expected = optax.chain(optax.clip_by_global_norm(1.0), rule)
    got = _updates(optim.make_optimizer(section, _constant(1e-3)))
    jax.tree.map(np.testing.assert_array_equal, got, _updates(expected))


def test_groups_freeze_scale_and_clip_without_the_frozen_gradients():
    section = _optimizer(eps=1.0, grad_clip_norm=1.0, pretrained_lr_scale=0.5)
    tx = optim.make_optimizer(section, _constant(1e-2), lambda params: GROUPS)
    got = _updates(tx)
    np.testing.assert_array_equal(got["embed"], 0.0)  # frozen
    # Adam's first step is -lr * g / (|g| + eps), g clipped to global norm 1: the norm of the
    # 'new' and 'old' gradients alone (sqrt(50)), the frozen 100s not counted.
    clipped = np.array([3.0, -4.0]) / np.sqrt(50.0)
    step = clipped / (np.abs(clipped) + 1.0)
    np.testing.assert_allclose(got["new"], -1e-2 * step, rtol=1e-6)
    np.testing.assert_allclose(got["old"], -0.5e-2 * step, rtol=1e-6)  # half the rate
    moments = [x.size for x in jax.tree.leaves(tx.init(PARAMS)) if np.ndim(x)]
    assert sum(moments) == 2 * (2 + 2)  # mu and nu of 'new' and 'old'; none for 'embed'


def test_accumulation_updates_on_every_kth_call_with_the_mean_gradient():
    section = _optimizer(name="adam", grad_accum_steps=2)
    tx = optim.make_optimizer(section, _constant(1e-2))
    state = tx.init(PARAMS)
    first, state = tx.update(GRADS, state, PARAMS)
    assert all(not np.any(x) for x in jax.tree.leaves(first))
    twice = jax.tree.map(lambda g: 3 * g, GRADS)
    second, _ = tx.update(twice, state, PARAMS)
    mean = jax.tree.map(lambda g: 2 * g, GRADS)
    plain = _updates(optim.make_optimizer(_optimizer(name="adam"), _constant(1e-2)), mean)
    jax.tree.map(np.testing.assert_allclose, jax.tree.map(np.asarray, second), plain)


# --------------------------------------------------------------------------- Muon, schedule-free
# (issue 51): the rules against optax's own on the parts they are made of.


def _model_params(model, *inputs, boxed=False):
    variables = jax.eval_shape(model.init, jax.random.key(0), *inputs)
    return variables["params"] if boxed else nn.unbox(variables)["params"]


def _flat_labels(labels) -> dict[str, str]:
    """'embed/embedding' -> label (a boxed tree's `.value` attribute keys left out)."""
    return {
        "/".join(str(k.key) for k in path if isinstance(k, jax.tree_util.DictKey)): label
        for path, label in jax.tree_util.tree_leaves_with_path(labels)
    }


@pytest.mark.parametrize("scan", [False, True])
def test_muon_takes_the_layers_matrices_and_adamw_the_rest(scan):
    config = TransformerConfig(
        vocab_size=30, d_model=16, num_heads=2, d_ff=32, num_layers=2, max_len=16,
        qk_norm=True, tie_output_embedding=False, positional="learned", scan_layers=scan,
    )  # fmt: skip
    tokens = jnp.ones((1, 4), jnp.int32)
    params = _model_params(Transformer(config), tokens, tokens)
    labels = _flat_labels(muon_partition(params))
    kernels = ("qkv_kernel", "query_kernel", "kv_kernel", "out_kernel", "wi_kernel", "wo_kernel")
    muon = {name for name, label in labels.items() if label == "muon"}
    assert muon == {name for name in labels if name.rsplit("/", 1)[1] in kernels}
    # Per layer, the encoder's qkv, out, wi, wo; the decoder's also cross-attention's query,
    # kv and out. A scanned stack holds its layers in one array.
    assert len(muon) == (4 + 7) * (1 if scan else 2)
    adamw = {name.rsplit("/", 1)[1] for name, label in labels.items() if label == "adamw"}
    assert adamw == {
        "embedding",
        "pos_embedding",
        "scale",
        "bias",
        "kernel",
        "query_norm_scale",
        "key_norm_scale",
        "qkv_bias",
        "query_bias",
        "kv_bias",
        "out_bias",
        "wi_bias",
        "wo_bias",
    }  # fmt: skip  (bias and kernel: the untied head, logits/)
    assert labels["decoder/logits/kernel"] == "adamw"
    # Boxed (init's) and unboxed (the step's) parameters get the same labels.
    boxed = _model_params(Transformer(config), tokens, tokens, boxed=True)
    assert _flat_labels(muon_partition(boxed)) == labels


def test_muon_axes_keep_each_layer_and_each_qkv_part_a_matrix_of_its_own():
    axes = muon_dimension_numbers(
        {
            "layers": {"self_attention": {"qkv_kernel": jnp.zeros((2, 8, 3, 2, 4))}},
            "layers_0": {
                "self_attention": {"out_kernel": jnp.zeros((2, 4, 8))},
                "ffn": {"wo_kernel": jnp.zeros((16, 8))},
            },
            "embed": {"embedding": jnp.zeros((5, 8))},
        }
    )
    dims = MuonDimensionNumbers
    assert axes["layers"]["self_attention"]["qkv_kernel"] == dims((1,), (3, 4))
    assert axes["layers_0"]["self_attention"]["out_kernel"] == dims((0, 1), (2,))
    assert axes["layers_0"]["ffn"]["wo_kernel"] == dims((0,), (1,))
    assert axes["embed"]["embedding"] is None


def _muon_section(**options):
    return _optimizer(
        name="muon", b2=0.99, eps=1e-8, weight_decay=0.1, options=MuonOptions(**options)
    )


def test_muon_updates_equal_optax_muon_per_matrix_and_adamw_elsewhere():
    """A scanned stack of two fused Q/K/V kernels (L, D, 3, N, H) and an embedding: each
    layer's q, k and v move as optax.contrib.muon moves that (D, N*H) matrix alone, and the
    embedding as optax.adamw moves it."""
    rng = np.random.default_rng(0)
    qkv = jnp.asarray(rng.normal(size=(2, 8, 3, 2, 4)), jnp.float32)
    emb = jnp.asarray(rng.normal(size=(5, 8)), jnp.float32)
    params = {"decoder": {"layers": {"self_attention": {"qkv_kernel": qkv}}}, "embed": emb}
    params = {"decoder": params["decoder"], "embed": {"embedding": emb}}
    grads = jax.tree.map(lambda x: jnp.asarray(rng.normal(size=x.shape), jnp.float32), params)
    section = _muon_section(learning_rate=0.02, momentum=0.9, weight_decay=0.01)
    tx = optim.make_optimizer(section, _constant(1e-3))
    state = tx.init(params)
    got = []
    for _ in range(2):  # two steps: the momentum is carried
        updates, state = tx.update(grads, state, params)
        got.append(updates)
    reference = optax.contrib.muon(0.02, beta=0.9, weight_decay=0.01, nesterov=True)
    for layer in range(2):
        for part in range(3):
            w = qkv[layer, :, part].reshape(8, 8)
            g = grads["decoder"]["layers"]["self_attention"]["qkv_kernel"][layer, :, part]
            ref_state = reference.init(w)
            for step in range(2):
                want, ref_state = reference.update(g.reshape(8, 8), ref_state, w)
                have = got[step]["decoder"]["layers"]["self_attention"]["qkv_kernel"]
                np.testing.assert_allclose(
                    have[layer, :, part].reshape(8, 8), want, rtol=1e-5, atol=1e-7
                )
    adamw = optax.adamw(1e-3, b1=0.9, b2=0.99, eps=1e-8, weight_decay=0.1)
    ref_state = adamw.init(emb)
    for step in range(2):
        want, ref_state = adamw.update(grads["embed"]["embedding"], ref_state, emb)
        np.testing.assert_array_equal(got[step]["embed"]["embedding"], want)


def test_muon_with_fine_tuning_groups():
    """Frozen: no update, no state; pretrained: the matrices' and the rest's rates scaled."""
    rng = np.random.default_rng(1)
    params = {
        "decoder": {"layers_0": {"ffn": {"wi_kernel": jnp.asarray(rng.normal(size=(8, 6)))}}},
        "embed": {"embedding": jnp.asarray(rng.normal(size=(5, 8)))},
        "head": {"bias": jnp.asarray(rng.normal(size=(5,)))},
    }
    params = jax.tree.map(lambda x: x.astype(jnp.float32), params)
    grads = jax.tree.map(lambda x: jnp.ones_like(x) + x, params)
    labels = {"decoder": {"layers_0": {"ffn": {"wi_kernel": "pretrained"}}}}
    labels |= {"embed": {"embedding": "frozen"}, "head": {"bias": "pretrained"}}
    section = dataclasses.replace(_muon_section(learning_rate=0.02), pretrained_lr_scale=0.5)
    grouped = optim.make_optimizer(section, _constant(1e-3), lambda p: labels)
    plain = optim.make_optimizer(section, _constant(1e-3))
    got, want = _updates(grouped, grads, params), _updates(plain, grads, params)
    np.testing.assert_array_equal(got["embed"]["embedding"], 0.0)
    for path in (("decoder", "layers_0", "ffn", "wi_kernel"), ("head", "bias")):
        have, full = got, want
        for key in path:
            have, full = have[key], full[key]
        np.testing.assert_allclose(have, 0.5 * full, rtol=1e-5, atol=1e-8)
    state_sizes = [x.size for x in jax.tree.leaves(grouped.init(params)) if np.ndim(x)]
    assert 5 * 8 not in state_sizes  # no moment of the frozen embedding


def test_schedule_free_is_optax_schedule_free_adamw_and_evaluates_its_average():
    section = _optimizer(name="schedule_free_adamw", grad_clip_norm=1.0, weight_decay=0.1)
    schedule_section = ScheduleConfig("constant", 1e-2, 2, 10)
    schedule = optim.make_schedule(schedule_section)
    tx = optim.make_optimizer(section, schedule_section)
    expected = optax.chain(
        optax.clip_by_global_norm(1.0),
        optax.contrib.schedule_free_adamw(schedule, b1=0.9, b2=0.98, eps=1e-9, weight_decay=0.1),
    )
    params = (PARAMS, PARAMS)
    states = (tx.init(PARAMS), expected.init(PARAMS))
    for _ in range(3):
        updates = [
            t.update(GRADS, s, p) for t, s, p in zip((tx, expected), states, params, strict=True)
        ]
        jax.tree.map(np.testing.assert_array_equal, updates[0][0], updates[1][0])
        states = tuple(u[1] for u in updates)
        params = tuple(optax.apply_updates(p, u[0]) for p, u in zip(params, updates, strict=True))
    evaluated = optim.evaluation_params(section, states[0], params[0])
    want = optax.contrib.schedule_free_eval_params(states[1][1], params[1])
    jax.tree.map(np.testing.assert_array_equal, evaluated, want)
    assert not np.allclose(evaluated["new"], params[0]["new"])  # x is not y
    # Found inside gradient accumulation's state too; any other rule evaluates its params.
    accumulated = _optimizer(name="schedule_free_adamw", grad_accum_steps=2)
    state = optim.make_optimizer(accumulated, schedule_section).init(PARAMS)
    assert optim.evaluation_params(accumulated, state, PARAMS) is not PARAMS
    adam = _optimizer(name="adam")
    adam_state = optim.make_optimizer(adam, schedule_section).init(PARAMS)
    assert optim.evaluation_params(adam, adam_state, PARAMS) is PARAMS
    with pytest.raises(ValueError, match="takes no fine-tuning groups"):
        optim.make_optimizer(section, schedule_section, lambda p: GROUPS)


@pytest.mark.parametrize(
    "fields, message",
    [
        (
            dict(name="sgd"),
            r"name='sgd': must be one of " + re.escape(str(tuple(optim.OPTIMIZERS))),
        ),
        (dict(learning_rate=0.0), r"--config.optimizer.muon.learning_rate=0.0: must be a"),
        (dict(momentum=1.0), r"--config.optimizer.muon.momentum=1.0: must be in \[0, 1\)"),
        (dict(name="schedule_free_adamw", b1=0.0), r"b1=0.0: must be in \(0, 1\) with"),
    ],
)
def test_optimizer_fields_are_checked(fields, message):
    with pytest.raises(ValueError, match=message):
        if "name" in fields:
            _optimizer(**fields)
        else:
            MuonOptions(**fields)
