"""Dropout module around `functional.dropout` (16 random bits per element)."""

from __future__ import annotations

import jax
from flax import linen as nn

from flax_transformer.functional.dropout import drop_threshold, dropout


class Dropout(nn.Module):
    """`flax.linen.Dropout`'s interface, drawing its masks with `functional.dropout`: half
    the PRNG work of `nn.Dropout` (rates to 2**-16; see `functional.dropout`).

    Attributes:
      rate: the probability of dropping an element, in [0, 1]; 1 gives zeros, as
        `nn.Dropout(1.0)` does (ValueError, naming `Dropout.rate`, outside that range).
      deterministic: no dropout (also settable per call).
      rng_collection: the PRNG stream the key comes from (`make_rng`).
    """

    rate: float
    deterministic: bool | None = None
    rng_collection: str = "dropout"

    @nn.compact
    def __call__(self, x: jax.Array, deterministic: bool | None = None) -> jax.Array:
        drop_threshold(self.rate, "Dropout", "rate")  # checked even when deterministic
        deterministic = nn.merge_param("deterministic", self.deterministic, deterministic)
        if deterministic or self.rate == 0.0:
            return x
        return dropout(x, self.rate, self.make_rng(self.rng_collection))
