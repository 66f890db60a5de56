"""Parameter initialisers shared by the layers, and the logical-axis box they put params in."""

from __future__ import annotations

from typing import Any

from flax import linen as nn

# Standard deviation of the normal init of embeddings and projections (GPT-2).
INIT_STD = 0.02

default_embed_init = nn.initializers.normal(stddev=INIT_STD)
zeros_init = nn.initializers.zeros_init()
ones_init = nn.initializers.ones_init()


class LogicalAxes(nn.LogicallyPartitioned):
    """`nn.LogicallyPartitioned` that Flax NNX can take in without a mesh.

    In linen it is `nn.LogicallyPartitioned` (the sharding rules read its names; `nn.unbox`
    strips it). Through `nnx.bridge.ToNNX` the names become the NNX variable's
    `out_sharding` metadata with `eager_sharding=False`: NNX would otherwise shard every new
    variable at creation and, with no mesh (the common case), refuse to create it ("An auto
    mesh context or metadata is required"). The names are kept, so
    `nnx.get_partition_spec(state)` still gives the logical layout to shard by.
    """

    def to_nnx_metadata(self) -> dict[str, Any]:
        # A copy: flax's own method pops the keys out of the instance's __dict__.
        metadata = dict(vars(self))
        metadata["out_sharding"] = metadata.pop("names")
        metadata["sharding_rules"] = metadata.pop("rules")
        metadata["eager_sharding"] = False
        return metadata


def partitioned(init, names: tuple[str | None, ...]):
    """`init` whose result carries logical axis names (read by the sharding rules)."""

    def boxed_init(*args, **kwargs):
        return LogicalAxes(init(*args, **kwargs), names)

    return boxed_init
