"""Run in a subprocess by test_sharding.py with 8 simulated CPU devices.

Compares one AdamW training step of a tiny model on a single device with the same step under
2x2x2 and 8x1x1 meshes (unrolled layers) and a 2x2x2 mesh (scanned layers), and of a
grouped-query model with rotary positions (2 key/value heads of 4) on a 2x2x2 mesh (the tensor
axis of 2 splits the key/value heads) and a 2x1x4 one (4 does not divide 2: replicated); and
checks that parameters are split as the rules say. Prints one JSON line with the results.

What is compared, and why not every parameter after the step: float32 sums ordered
differently on a mesh change a gradient by ~1e-9 (about 1e-6 of its leaf's largest entry).
AdamW's first step moves each parameter by lr * g / (|g| + eps), which for a gradient near
eps = 1e-8 turns that noise into a change up to lr itself: the key bias's gradient is
exactly zero in exact arithmetic (softmax ignores a shift shared by every key) and comes out
as +-4e-12, so its step is an arbitrary sign times ~lr/1000. So the check reports the loss, the
gradients relative to each leaf's largest entry, and the parameters after the step where
the single-device gradient is above `RESOLVED_GRAD` (there a gradient difference of 1e-9, the
size measured, moves a parameter by at most lr * eps / RESOLVED_GRAD^2 * 1e-9 = 1e-7).
"""

import json
import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from flax import linen as nn  # noqa: E402

from flax_transformer import Transformer, TransformerConfig  # noqa: E402
from flax_transformer.sharding import (  # noqa: E402
    DEFAULT_RULES,
    init_sharded,
    make_mesh,
    replicated,
)

RESOLVED_GRAD = 1e-6


def check(scan_layers: bool, mesh_shapes, **options) -> dict:
    cfg = TransformerConfig(
        vocab_size=64,
        d_model=32,
        num_heads=4,
        d_ff=64,
        num_layers=2,
        max_len=16,
        dropout_rate=0.0,
        scan_layers=scan_layers,
        **options,
    )
    model = Transformer(cfg)
    rng = np.random.default_rng(0)
    src = jnp.asarray(rng.integers(1, 64, (8, 12)), jnp.int32).at[:, -3:].set(0)
    tgt = jnp.asarray(rng.integers(1, 64, (8, 10)), jnp.int32)
    labels = jnp.roll(tgt, -1, axis=1)
    tx = optax.adamw(1e-2)

    def loss_fn(params):
        logits = model.apply(params, src, tgt)
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    # One program per mesh returns the step's gradients beside its result (a separate
    # `jax.grad` program would double the compiles, which are most of this script's time).
    def step(params, opt_state):
        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss, grads

    params = nn.unbox(jax.jit(model.init)(jax.random.key(0), src, tgt))
    ref_params, _, ref_loss, ref_grads = jax.jit(step)(params, tx.init(params))

    results = {}
    for shape in mesh_shapes:
        mesh = make_mesh(*shape)
        sharded, shardings = init_sharded(model, mesh, jax.random.key(0), src, tgt)
        opt_state = tx.init(sharded)
        with jax.set_mesh(mesh), nn.logical_axis_rules(DEFAULT_RULES):
            new_params, _, loss, grads = jax.jit(
                step, out_shardings=(shardings, None, replicated(mesh), shardings)
            )(sharded, opt_state)
        grad_diff = max(
            float(jnp.max(jnp.abs(a - b)) / max(float(jnp.max(jnp.abs(b))), 1e-30))
            for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads), strict=True)
        )
        diff = max(
            float(jnp.max(jnp.where(jnp.abs(g) > RESOLVED_GRAD, jnp.abs(a - b), 0.0)))
            for a, b, g in zip(
                jax.tree.leaves(new_params),
                jax.tree.leaves(ref_params),
                jax.tree.leaves(ref_grads),
                strict=True,
            )
        )
        layer = new_params["params"]["encoder"]
        layer = layer["layers"] if cfg.scan_layers else layer["layers_0"]
        attention = layer["self_attention"]
        kernel = attention["qkv_kernel"] if "qkv_kernel" in attention else attention["kv_kernel"]
        results["x".join(map(str, shape))] = {
            "max_param_diff": diff,
            "max_grad_rel_diff": grad_diff,
            "loss_diff": abs(float(loss) - float(ref_loss)),
            "qkv_spec": [str(a) for a in kernel.sharding.spec],
            "qkv_shard_shape": list(kernel.addressable_shards[0].data.shape),
            "qkv_shape": list(kernel.shape),
            "embed_spec": [
                str(a) for a in new_params["params"]["embed"]["embedding"].sharding.spec
            ],
        }
    return results


def main() -> None:
    assert jax.device_count() == 8, jax.devices()
    results = {
        "unrolled": check(False, [(2, 2, 2), (8, 1, 1)]),
        "scan": check(True, [(2, 2, 2)]),
        "gqa": check(False, [(2, 2, 2), (2, 1, 4)], num_kv_heads=2, positional="rope"),
    }
    print(json.dumps(results))


if __name__ == "__main__":
    main()
