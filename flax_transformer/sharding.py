"""Device meshes and logical-axis sharding rules.

Model code names logical axes only (`flax_transformer.axes`); the rules below say which mesh
axis each one is split over. The mesh has three named axes:

  data    batch split (pure data parallelism: parameters replicated)
  fsdp    batch split too, and parameters split along their 'embed' axis (ZeRO-3 style)
  tensor  Megatron-style split of heads, feed-forward width and vocabulary

On one device every axis has size 1 and all of this is a no-op. Multi-host runs call
`jax.distributed.initialize()` first (see docs/multiprocess.md); `make_mesh` then spans every
process's devices.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Sequence

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
    # Grouped-query key/value heads (K < N); `model_rules` replicates them instead when the
    # tensor axis does not divide K (e.g. K = 1, multi-query attention).
    (axes.KV_HEADS, "tensor"),
    (axes.MLP, "tensor"),
    (axes.VOCAB, "tensor"),
    (axes.KV, None),
    (axes.QKV, None),
    (axes.LORA, None),
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
    if devices is not None and not isinstance(devices, Sequence | np.ndarray):
        raise TypeError(
            f"make_mesh: devices={devices!r} must be a sequence of devices (or None: all), got "
            f"{type(devices).__name__}; for one device pass a list of it: devices=[device]."
        )
    devices = list(jax.devices() if devices is None else devices)
    if not devices:
        raise ValueError("make_mesh: devices is empty; pass at least one device (or None: all).")
    sizes = [data, fsdp, tensor]
    for name, size in zip(MESH_AXES, sizes, strict=True):
        if isinstance(size, bool) or not isinstance(size, int | np.integer):
            raise ValueError(
                f"make_mesh: {name}={size!r} must be an int (a positive size, or -1 for the "
                "devices left over)."
            )
    sizes = [int(s) for s in sizes]
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


def model_rules(config, mesh: Mesh, rules=DEFAULT_RULES):
    """`rules` fitted to a model config on `mesh`: key/value heads and the vocabulary split
    where they can be.

    The K key/value heads of grouped-query attention (`config.num_kv_heads`) are split
    over the `tensor` axis when its size divides K; otherwise (K = 1, or K = 2 on a tensor
    axis of 4) every device holds all K heads, the small K/V kernels and cache replicated
    while the N query heads stay split. Likewise a vocabulary the `tensor` axis does not
    divide (an imported checkpoint's V + 1 ids, e.g. Llama's 32,001) keeps whole embedding
    rows on every device instead of failing to place them.

    Args:
      config: a `TransformerConfig` (or anything with `kv_heads`); None returns `rules`.
      mesh: the device mesh.
      rules: the rules to adjust (default `DEFAULT_RULES`).
    """
    if config is None:
        return tuple(rules)
    tensor = dict(zip(mesh.axis_names, mesh.devices.shape, strict=True)).get("tensor", 1)
    whole = set()
    if config.kv_heads % tensor:
        whole.add(axes.KV_HEADS)
    vocab_sizes = (getattr(config, "vocab_size", 0), getattr(config, "target_vocab_size", 0))
    if any(v and v % tensor for v in vocab_sizes):
        whole.add(axes.VOCAB)
    return tuple((name, None if name in whole else target) for name, target in rules)


def logical_shardings(boxed_tree, mesh: Mesh, rules=DEFAULT_RULES):
    """NamedShardings for a tree of `nn.LogicallyPartitioned` leaves (e.g. from `eval_shape`).

    Leaves without logical names are replicated.
    """
    specs = nn.get_partition_spec(boxed_tree)
    return nn.logical_to_mesh_sharding(specs, mesh, rules)


def check_divisible(boxed_tree, mesh: Mesh, rules=DEFAULT_RULES) -> None:
    """ValueError if a parameter's axis cannot be split evenly over its mesh axes.

    Args:
      boxed_tree: parameters with logical axis names (`nn.LogicallyPartitioned` leaves,
        e.g. `jax.eval_shape(model.init, ...)`); leaves without names are replicated.
      mesh: the device mesh.
      rules: logical-to-mesh rules (`model_rules(config, mesh)`).

    Raises:
      ValueError: naming the parameter, its logical axis and size, the mesh axes and their
        size, and the mesh sizes that would divide it.
    """
    axis_size = dict(zip(mesh.axis_names, mesh.devices.shape, strict=True))
    specs = nn.get_partition_spec(boxed_tree)
    shapes = jax.tree.map(lambda x: x.shape, nn.unbox(boxed_tree))
    flat_specs = jax.tree_util.tree_flatten_with_path(
        specs, is_leaf=lambda x: isinstance(x, PartitionSpec)
    )[0]
    flat_shapes = jax.tree.leaves(shapes, is_leaf=lambda x: isinstance(x, tuple))
    for (path, logical), shape in zip(flat_specs, flat_shapes, strict=True):
        if not isinstance(logical, PartitionSpec):
            continue
        mesh_axes = nn.logical_to_mesh_axes(tuple(logical), rules)
        for dim, (name, target) in enumerate(zip(logical, mesh_axes, strict=False)):
            if target is None:
                continue
            targets = (target,) if isinstance(target, str) else tuple(target)
            parts = int(np.prod([axis_size[t] for t in targets]))
            if shape[dim] % parts:
                size = shape[dim]
                fits = [
                    d for d in range(1, size + 1) if size % d == 0 and d <= len(mesh.devices.flat)
                ]
                raise ValueError(
                    f"parameter {jax.tree_util.keystr(path)} of shape {shape}: its axis {dim} "
                    f"('{name}', size {size}) is split over mesh axes {targets} of size "
                    f"{parts}, which does not divide {size}. Make the product of {targets} "
                    f"one of {fits}, or make that size a multiple of {parts}."
                )


def batch_sharding(mesh: Mesh, rank: int = 2) -> NamedSharding:
    """Sharding of a `(B, ...)` input batch of `rank` axes: B split over the data and fsdp
    axes, the other `rank - 1` axes whole on every device.

    Returns:
      `NamedSharding(mesh, PartitionSpec(("data", "fsdp"), None, ...))`: each device holds
      `B / (data * fsdp)` rows (B must be a multiple of that product); devices that differ
      only in their `tensor` coordinate hold the same rows.
    """
    return NamedSharding(mesh, PartitionSpec(("data", "fsdp"), *([None] * (rank - 1))))


@contextlib.contextmanager
def mesh_rules(mesh: Mesh, rules=DEFAULT_RULES) -> Iterator[None]:
    """Trace model code with `mesh` and the logical axis `rules` in scope.

    The models pin their activations with `nn.with_logical_constraint` (batch rows over
    data x fsdp, after the embedding and every layer). Those calls read the rules and the
    mesh from the context they are traced in; without both they do nothing, the lowered
    step has no sharding constraints, and XLA chooses the activations' layout itself (on a
    mesh with fsdp or tensor > 1 it may gather the batch and warn of "involuntary full
    rematerialization"). Only the abstract mesh (axis names and sizes) is set, which is all
    tracing needs.

    Use it where the step is traced, inside the function given to `jax.jit`
    (`on_mesh` does that); around a call of a jitted function it works only for that
    function's first trace, since flax's rules are not part of jit's cache key.

    Args:
      mesh: the device mesh (`make_mesh`).
      rules: logical-to-mesh rules; `model_rules(config, mesh)` for grouped-query models.
    """
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh), nn.logical_axis_rules(rules):
        yield


def on_mesh(step: Callable, mesh: Mesh, rules=DEFAULT_RULES) -> Callable:
    """`step` traced inside `mesh_rules(mesh, rules)`: pass the result to `jax.jit`.

        train = jax.jit(on_mesh(step, mesh, model_rules(config, mesh)), in_shardings=...)

    Args:
      step: any function that applies a model (a training or evaluation step).
      mesh: the device mesh.
      rules: logical-to-mesh rules (default `DEFAULT_RULES`).

    Returns:
      A function with `step`'s signature and result.
    """

    @functools.wraps(step)
    def traced(*args, **kwargs):
        with mesh_rules(mesh, rules):
            return step(*args, **kwargs)

    return traced


def replicated(mesh: Mesh) -> NamedSharding:
    """Sharding of a value every device holds whole (scalars, rng keys, step counters)."""
    return NamedSharding(mesh, PartitionSpec())


def init_sharded(model: nn.Module, mesh: Mesh, rng: jax.Array, *example_inputs, rules=None):
    """Initialise `model` directly into its sharded layout (no full copy on one device).

    `rules` default: `model_rules(model.config, mesh)` (`DEFAULT_RULES` for a model without
    a config).

    Returns:
      `(params, shardings)`: unboxed parameters placed per the rules, and their shardings.

    Raises:
      ValueError: a parameter axis the mesh cannot split evenly (`check_divisible`).
    """
    if rules is None:
        rules = model_rules(getattr(model, "config", None), mesh)
    abstract = jax.eval_shape(model.init, rng, *example_inputs)
    check_divisible(abstract, mesh, rules)
    shardings = nn.unbox(logical_shardings(abstract, mesh, rules))

    def init(key):
        return nn.unbox(model.init(key, *example_inputs))

    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        params = jax.jit(init, out_shardings=shardings)(rng)
    return params, shardings
