"""Device meshes and logical-axis sharding rules.

Model code names logical axes only (`flax_transformer.axes`); the rules below say which mesh
axis each one is split over. The mesh has three named axes:

  data    batch split (pure data parallelism: parameters replicated)
  fsdp    batch split too, and parameters split along their 'embed' axis (ZeRO-3 style)
  tensor  Megatron-style split of heads, feed-forward width and vocabulary

On one device every axis has size 1 and all of this is a no-op. Multi-host runs call
`jax.distributed.initialize()` first (see the README); `make_mesh` then spans every
process's devices.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np
from flax import linen as nn
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from flax_transformer import axes

MESH_AXES = ("data", "fsdp", "tensor")

# (logical axis, mesh axis or axes). Earlier rules win; an axis already used by another
# dimension of the same array is skipped (flax's logical_to_mesh_axes semantics).
DEFAULT_RULES: tuple[tuple[str, str | tuple[str, ...] | None], ...] = (
    (axes.BATCH, ("data", "fsdp")),
    (axes.EMBED, "fsdp"),
    (axes.HEADS, "tensor"),
    (axes.MLP, "tensor"),
    (axes.VOCAB, "tensor"),
    (axes.KV, None),
    (axes.QKV, None),
    (axes.LENGTH, None),
    (axes.LAYERS, None),
)


def make_mesh(
    data: int = -1, fsdp: int = 1, tensor: int = 1, devices: Sequence[jax.Device] | None = None
) -> Mesh:
    """A `(data, fsdp, tensor)` mesh over `devices` (default: all devices).

    Args:
      data, fsdp, tensor: axis sizes; one of them may be -1 to take what is left.

    Raises:
      ValueError: when the sizes do not multiply to the number of devices.
    """
    devices = list(jax.devices() if devices is None else devices)
    sizes = [data, fsdp, tensor]
    if sizes.count(-1) > 1:
        raise ValueError(f"at most one mesh axis may be -1, got (data, fsdp, tensor)={sizes}.")
    if any(s == 0 or s < -1 for s in sizes):
        raise ValueError(f"mesh axis sizes must be positive or -1, got {sizes}.")
    known = int(np.prod([s for s in sizes if s != -1]))
    if -1 in sizes:
        if len(devices) % known:
            raise ValueError(
                f"cannot fill mesh (data, fsdp, tensor)={sizes} with {len(devices)} devices: "
                f"{len(devices)} is not divisible by {known}."
            )
        sizes[sizes.index(-1)] = len(devices) // known
    if int(np.prod(sizes)) != len(devices):
        raise ValueError(
            f"mesh (data, fsdp, tensor)={tuple(sizes)} needs {int(np.prod(sizes))} devices, "
            f"but {len(devices)} are available; make the sizes multiply to {len(devices)}."
        )
    return Mesh(np.asarray(devices).reshape(sizes), MESH_AXES)


def logical_shardings(boxed_tree, mesh: Mesh, rules=DEFAULT_RULES):
    """NamedShardings for a tree of `nn.LogicallyPartitioned` leaves (e.g. from `eval_shape`).

    Leaves without logical names are replicated.
    """
    specs = nn.get_partition_spec(boxed_tree)
    return nn.logical_to_mesh_sharding(specs, mesh, rules)


def batch_sharding(mesh: Mesh, rank: int = 2) -> NamedSharding:
    """Sharding of a `(B, ...)` input batch: B split over the data and fsdp axes."""
    return NamedSharding(mesh, PartitionSpec(("data", "fsdp"), *([None] * (rank - 1))))


def replicated(mesh: Mesh) -> NamedSharding:
    """Sharding of a value every device holds whole (scalars, rng keys, step counters)."""
    return NamedSharding(mesh, PartitionSpec())


def init_sharded(
    model: nn.Module, mesh: Mesh, rng: jax.Array, *example_inputs, rules=DEFAULT_RULES
):
    """Initialise `model` directly into its sharded layout (no full copy on one device).

    Returns:
      `(params, shardings)`: unboxed parameters placed per the rules, and their shardings.
    """
    abstract = jax.eval_shape(model.init, rng, *example_inputs)
    shardings = nn.unbox(logical_shardings(abstract, mesh, rules))

    def init(key):
        return nn.unbox(model.init(key, *example_inputs))

    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        params = jax.jit(init, out_shardings=shardings)(rng)
    return params, shardings
