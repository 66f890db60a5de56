"""Parameter initialisers shared by the layers."""

from flax import linen as nn

# Standard deviation of the normal init of embeddings and projections (seed 000, GPT-2).
INIT_STD = 0.02

default_kernel_init = nn.initializers.normal(stddev=INIT_STD)
default_embed_init = nn.initializers.normal(stddev=INIT_STD)
zeros_init = nn.initializers.zeros_init()
ones_init = nn.initializers.ones_init()


def partitioned(init, names):
    """`init` with logical axis names attached (read by the sharding rules)."""
    return nn.with_logical_partitioning(init, names)
