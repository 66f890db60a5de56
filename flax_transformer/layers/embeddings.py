"""Token embeddings and positional encodings."""

from __future__ import annotations

from typing import Any

import chex
import jax
import jax.numpy as jnp
from flax import linen as nn

from flax_transformer import axes
from flax_transformer.functional import project, sinusoidal_positions
from flax_transformer.layers.initializers import INIT_STD, default_embed_init, partitioned


class Embed(nn.Module):
    """A `(V, D)` lookup table; `attend` reuses it as the output projection (tied logits).

    Attributes:
      vocab_size: V.
      features: D.
      init_std: standard deviation of the normal init (INIT_STD = 0.02, as GPT-2).
      dtype, param_dtype: compute and storage dtypes.
    """

    vocab_size: int
    features: int
    init_std: float = INIT_STD
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    def setup(self):
        self.embedding = self.param(
            "embedding",
            partitioned(nn.initializers.normal(self.init_std), (axes.VOCAB, axes.EMBED)),
            (self.vocab_size, self.features),
            self.param_dtype,
        )

    def __call__(self, ids: jax.Array) -> jax.Array:
        """ids `(...)` int -> `(..., D)`.

        The models check ids where they are concrete (`check_tokens`). An id outside
        [0, V) that reaches this lookup (under `jit`, unchecked) embeds as NaN, negative
        ids included: it never reads another token's row.
        """
        return _take_or_nan(self.embedding, ids).astype(self.dtype)

    def attend(self, x_BTD: jax.Array) -> jax.Array:
        """x `(..., D)` -> float32 logits `(..., V)` against the embedding matrix, the
        operands in `dtype` and the sum in float32 (`functional.precision`)."""
        return project(x_BTD.astype(self.dtype), self.embedding.astype(self.dtype).T)


class PositionalEncoding(nn.Module):
    """Adds position information: the fixed sinusoidal table or a learned `(max_len, D)` one.

    Attributes:
      max_len: number of positions covered.
      kind: 'sinusoidal' or 'learned'.
      param_dtype: storage dtype of the learned table.
    """

    max_len: int
    kind: str = "sinusoidal"
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x_BTD: jax.Array, *, positions_BT: jax.Array | None = None) -> jax.Array:
        """x `(B, T, D)` plus the encoding of `positions_BT` (default 0..T-1).

        A position outside [0, max_len) (possible only unchecked under `jit`; the models
        check concrete ones) adds NaN.
        """
        chex.assert_rank(x_BTD, 3)
        _, length, width = x_BTD.shape
        if positions_BT is None:
            if length > self.max_len:
                raise ValueError(
                    f"sequence length {length} exceeds max_len={self.max_len}; shorten the "
                    "input or raise TransformerConfig.max_len."
                )
            positions_BT = jnp.arange(length)[None, :]
        if self.kind == "learned":
            table = self.param(
                "pos_embedding",
                partitioned(default_embed_init, (axes.LENGTH, axes.EMBED)),
                (self.max_len, width),
                self.param_dtype,
            )
        else:
            table = sinusoidal_positions(self.max_len, width)
        pos_BTD = _take_or_nan(table, positions_BT)
        return x_BTD + pos_BTD.astype(x_BTD.dtype)


def _take_or_nan(table_ND: jax.Array, index: jax.Array) -> jax.Array:
    """Rows `index` of the table; NaN rows for an index outside [0, N), negative included.

    `jnp.take` would wrap -1 around to row N - 1 (numpy indexing); mapping every index
    outside the table to N makes its out-of-bounds fill (NaN) apply to both ends.
    """
    rows = table_ND.shape[0]
    index = jnp.where((index < 0) | (index >= rows), rows, index)
    return jnp.take(table_ND, index, axis=0, mode="fill", fill_value=jnp.nan)
