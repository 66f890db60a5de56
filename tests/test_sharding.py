"""Sharded training step on 8 simulated CPU devices equals the single-device step."""

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from flax_transformer.sharding import make_mesh

SCRIPT = Path(__file__).with_name("sharded_step_check.py")


@pytest.fixture(scope="module")
def sharded_results():
    # The checkout's package first, not whichever copy is installed in the environment.
    root = str(SCRIPT.parents[1])
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=path)
    out = subprocess.run(
        [sys.executable, str(SCRIPT)], capture_output=True, text=True, env=env, timeout=600
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # the fixture trains in a subprocess with 8 simulated devices
@pytest.mark.parametrize("mode", ["unrolled", "scan"])
def test_sharded_step_equals_single_device(sharded_results, mode):
    results = sharded_results[mode]
    for shape, r in results.items():
        assert r["max_grad_rel_diff"] < 1e-5, (shape, r)
        assert r["max_param_diff"] < 1e-6, (shape, r)
        assert r["loss_diff"] < 1e-5, (shape, r)
    lead = ["None"] if mode == "scan" else []  # the stacked 'layers' axis is not split
    # qkv kernel (D, 3, N, H): embed over fsdp, heads over tensor.
    assert results["2x2x2"]["qkv_spec"] == lead + ["fsdp", "None", "tensor", "None"]
    shape = results["2x2x2"]["qkv_shape"]
    expected = list(shape)
    expected[len(lead)] //= 2
    expected[len(lead) + 2] //= 2
    assert results["2x2x2"]["qkv_shard_shape"] == expected
    assert results["2x2x2"]["embed_spec"] == ["tensor", "fsdp"]
    if mode == "unrolled":
        # Pure data parallelism: fsdp and tensor have size 1, so every shard is whole.
        assert results["8x1x1"]["qkv_shard_shape"] == results["8x1x1"]["qkv_shape"]


@pytest.mark.slow
def test_grouped_query_kv_heads_split_over_tensor_only_where_it_divides_them(sharded_results):
    results = sharded_results["gqa"]
    for shape, r in results.items():
        assert r["max_grad_rel_diff"] < 1e-5, (shape, r)
        assert r["max_param_diff"] < 1e-6, (shape, r)
        assert r["loss_diff"] < 1e-5, (shape, r)
    # kv kernel (D, 2, K, H) with K = 2: a tensor axis of 2 splits K ...
    assert results["2x2x2"]["qkv_spec"] == ["fsdp", "None", "tensor", "None"]
    assert results["2x2x2"]["qkv_shard_shape"] == [16, 2, 1, 8]
    # ... one of 4 cannot, so every device holds both heads (fsdp has size 1 there).
    assert results["2x1x4"]["qkv_spec"] == ["fsdp", "None", "None", "None"]
    assert results["2x1x4"]["qkv_shard_shape"] == results["2x1x4"]["qkv_shape"]


def test_model_rules_replicate_kv_heads_the_tensor_axis_does_not_divide():
    from flax_transformer import TransformerConfig, axes
    from flax_transformer.sharding import DEFAULT_RULES, model_rules

    class FakeMesh:  # model_rules reads only the axis sizes
        axis_names = ("data", "fsdp", "tensor")

        def __init__(self, tensor):
            self.devices = np.empty((1, 1, tensor))

    config = TransformerConfig(num_heads=8, d_model=64, num_kv_heads=2)
    assert model_rules(config, FakeMesh(2)) == DEFAULT_RULES
    rules = dict(model_rules(config, FakeMesh(4)))
    assert rules[axes.KV_HEADS] is None and rules[axes.HEADS] == "tensor"
    assert model_rules(None, FakeMesh(4)) == DEFAULT_RULES
    # An imported checkpoint's vocabulary of V + 1 ids (odd): whole rows on every device.
    odd = TransformerConfig(num_heads=8, d_model=64, vocab_size=32001)
    rules = dict(model_rules(odd, FakeMesh(2)))
    assert rules[axes.VOCAB] is None and rules[axes.HEADS] == "tensor"
    assert dict(model_rules(odd, FakeMesh(1)))[axes.VOCAB] == "tensor"


def test_make_mesh_errors_name_sizes():
    n = jax.device_count()
    assert make_mesh().devices.shape == (n, 1, 1)
    with pytest.raises(ValueError, match=r"needs 6 devices"):
        make_mesh(3, 2, 1)
    with pytest.raises(ValueError, match="at most one mesh axis may be -1"):
        make_mesh(-1, -1)
    with pytest.raises(ValueError, match="positive or -1"):
        make_mesh(0)
    with pytest.raises(TypeError, match=r"sequence of devices.*devices=\[device\]"):
        make_mesh(devices=jax.devices()[0])


def _activation_constraints(step, *args) -> int:
    """Sharding constraints on a mesh in `step`'s lowered program (flax also pins the
    dropout key, on an empty mesh, whatever the context; those are not counted)."""
    text = jax.jit(step).lower(*args).as_text()
    return sum(
        "sharding_constraint" in line and "@empty_mesh" not in line for line in text.splitlines()
    )


def test_on_mesh_and_mesh_rules_keep_the_models_activation_constraints():
    import jax.numpy as jnp
    from flax import linen as nn

    from flax_transformer import Transformer, TransformerConfig, mesh_rules, on_mesh

    config = TransformerConfig(
        vocab_size=16, d_model=8, num_heads=2, d_ff=16, num_layers=1, max_len=8
    )
    model = Transformer(config)
    src = jnp.ones((2, 4), jnp.int32)
    tgt = jnp.ones((2, 3), jnp.int32)
    params = jax.eval_shape(lambda: nn.unbox(model.init(jax.random.key(0), src, tgt)))

    def step(params, src, tgt):
        return jax.value_and_grad(lambda p: model.apply(p, src, tgt).sum())(params)

    def step_in_context(*args):
        with mesh_rules(mesh):
            return step(*args)

    mesh = make_mesh()
    # Both stacks' embedding outputs and their one layer's output, forward and backward.
    assert _activation_constraints(step, params, src, tgt) == 0
    assert _activation_constraints(on_mesh(step, mesh), params, src, tgt) == 8
    assert _activation_constraints(step_in_context, params, src, tgt) == 8
