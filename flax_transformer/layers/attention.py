"""MultiHeadAttention: fused projections for all heads around `functional.multi_head_attention`.

Seed 000: rather than N small (D, H) matrices per head, the projections for all heads are
one big matrix. Self-attention uses one fused Q/K/V kernel `(D, 3, N, H)`; cross-attention
a query kernel `(D, N, H)` and a fused key/value kernel `(D, 2, N, H)`. The output
projection W_O is `(N, H, D)`.
"""

from __future__ import annotations

from typing import Any

import chex
import jax
import jax.numpy as jnp
from flax import linen as nn

from flax_transformer import axes
from flax_transformer.functional import multi_head_attention
from flax_transformer.layers.initializers import default_kernel_init, partitioned, zeros_init


class MultiHeadAttention(nn.Module):
    """Multi-head scaled dot-product attention (self, causal self, or cross).

    Attributes:
      num_heads: N; must divide the input width D.
      cross: False: queries, keys and values all come from `x_q` (fused Q/K/V kernel).
        True: keys and values come from `x_kv` (query kernel + fused K/V kernel).
      dropout_rate: dropout on the attention weights.
      use_bias: biases on the projections.
      impl: 'xla' (our vmapped attention) or 'jax_nn' (`jax.nn.dot_product_attention`).
      dtype, param_dtype: compute and storage dtypes (softmax is float32 regardless).

    The attention weights `(B, N, T, S)` are sown into the 'intermediates' collection as
    'attention_weights' when that collection is mutable (off by default, free when off).
    """

    num_heads: int
    cross: bool = False
    dropout_rate: float = 0.0
    use_bias: bool = True
    impl: str = "xla"
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    def _project(
        self, name: str, x_BTD: jax.Array, features: tuple[int, ...], names: tuple[str, ...]
    ) -> jax.Array:
        """x `(B, T, D)` @ kernel `(D, *features)` (+ bias) -> `(B, T, *features)`."""
        width = x_BTD.shape[-1]
        kernel = self.param(
            f"{name}_kernel",
            partitioned(default_kernel_init, (axes.EMBED, *names)),
            (width, *features),
            self.param_dtype,
        )
        y = jnp.tensordot(x_BTD.astype(self.dtype), kernel.astype(self.dtype), axes=1)
        if self.use_bias:
            bias = self.param(
                f"{name}_bias", partitioned(zeros_init, names), features, self.param_dtype
            )
            y = y + bias.astype(self.dtype)
        return y

    @nn.compact
    def __call__(
        self,
        x_q: jax.Array,
        x_kv: jax.Array | None = None,
        mask: jax.Array | None = None,
        *,
        deterministic: bool = True,
    ) -> jax.Array:
        """Attend from `x_q` to itself (cross=False) or to `x_kv` (cross=True).

        Args:
          x_q: queries' inputs `(B, T, D)`.
          x_kv: keys'/values' inputs `(B, S, D)`; required iff `cross`.
          mask: bool, broadcastable to `(B, N, T, S)`; True where attention is allowed.
          deterministic: disable dropout (else the 'dropout' rng stream is used).

        Returns:
          `(B, T, D)` in `dtype`.
        """
        chex.assert_rank(x_q, 3)
        batch, q_len, width = x_q.shape
        if width % self.num_heads:
            raise ValueError(f"num_heads={self.num_heads} does not divide the input width {width}.")
        head_dim = width // self.num_heads
        nh = (self.num_heads, head_dim)
        if self.cross:
            if x_kv is None:
                raise ValueError("cross-attention needs x_kv (the encoder output).")
            chex.assert_rank(x_kv, 3)
            q_BTNH = self._project("query", x_q, nh, (axes.HEADS, axes.KV))
            kv_BS2NH = self._project("kv", x_kv, (2, *nh), (axes.QKV, axes.HEADS, axes.KV))
            k_BSNH, v_BSNH = kv_BS2NH[:, :, 0], kv_BS2NH[:, :, 1]
        else:
            if x_kv is not None:
                raise ValueError("self-attention takes no x_kv; build with cross=True.")
            qkv_BT3NH = self._project("qkv", x_q, (3, *nh), (axes.QKV, axes.HEADS, axes.KV))
            q_BTNH, k_BSNH, v_BSNH = (qkv_BT3NH[:, :, i] for i in range(3))
        chex.assert_shape(q_BTNH, (batch, q_len, *nh))
        chex.assert_equal_shape([k_BSNH, v_BSNH])

        use_dropout = not deterministic and self.dropout_rate > 0.0
        if self.impl == "jax_nn" and not use_dropout:
            if mask is not None:
                mask = jnp.broadcast_to(mask, (batch, self.num_heads, q_len, k_BSNH.shape[1]))
            out_BTNH = jax.nn.dot_product_attention(q_BTNH, k_BSNH, v_BSNH, mask=mask)
        else:
            rng = self.make_rng("dropout") if use_dropout else None
            out_BTNH, weights_BNTS = multi_head_attention(
                q_BTNH,
                k_BSNH,
                v_BSNH,
                mask,
                dropout_rate=self.dropout_rate,
                dropout_rng=rng,
            )
            self.sow("intermediates", "attention_weights", weights_BNTS)

        w_out = self.param(
            "out_kernel",
            partitioned(default_kernel_init, (axes.HEADS, axes.KV, axes.EMBED)),
            (*nh, width),
            self.param_dtype,
        )
        y_BTD = jnp.einsum("btnh,nhd->btd", out_BTNH.astype(self.dtype), w_out.astype(self.dtype))
        if self.use_bias:
            b_out = self.param(
                "out_bias", partitioned(zeros_init, (axes.EMBED,)), (width,), self.param_dtype
            )
            y_BTD = y_BTD + b_out.astype(self.dtype)
        return y_BTD
