"""KV cache bytes per token at 8, 2 and 1 key/value heads. Run it by hand:

    python -m benchmarks.kv_cache

The model is the 8-head base size (d_model 512, 6 layers, H = 64, float32 cache; the
`dec_base` of RESULTS.md, `configs/transformer_base.py`'s width and depth). Bytes are read
off the cache pytree that generation allocates (`decoding.init_cache` under
`jax.eval_shape`: shapes only, nothing allocated), not from a formula: self-attention bytes
per generated or prompt token, and for the encoder-decoder the cross-attention bytes per
source token.
"""

from __future__ import annotations

import jax
import numpy as np

from flax_transformer import TransformerConfig
from flax_transformer.decoding import init_cache

BASE = TransformerConfig(
    vocab_size=32000, d_model=512, num_heads=8, d_ff=2048, num_layers=6, max_len=256
)
KV_HEADS = (8, 2, 1)


def _bytes(tree) -> int:
    return sum(int(np.prod(x.shape)) * x.dtype.itemsize for x in jax.tree.leaves(tree))


def cache_bytes_per_token(config: TransformerConfig) -> dict[str, float]:
    """`{'self': bytes per decoder token, 'cross': bytes per source token}` of one sequence.

    Measured on the `jax.eval_shape` of an encoder-decoder cache of `config.max_len` decoder
    slots and as many source positions (keys and values grow linearly with both, so any
    length gives the same bytes per token); a decoder-only model's cache is the 'self' part.
    """
    length = config.max_len
    cache = jax.eval_shape(lambda: init_cache(config, 1, length, length))
    layers = cache["decoder"].values()
    self_bytes = sum(_bytes(layer["self_attention"]) for layer in layers)
    cross_bytes = sum(_bytes(layer["cross_attention"]) for layer in layers)
    return {"self": self_bytes / length, "cross": cross_bytes / length}


def table(config: TransformerConfig = BASE, kv_heads=KV_HEADS) -> str:
    """A markdown table of `cache_bytes_per_token` at each number of key/value heads."""
    rows = [
        "| num_kv_heads | cache bytes / token (decoder self-attention) "
        "| cross-attention bytes / source token | vs 8 heads |",
        "|---|---|---|---|",
    ]
    full = cache_bytes_per_token(config.replace(num_kv_heads=kv_heads[0]))["self"]
    for k in kv_heads:
        sizes = cache_bytes_per_token(config.replace(num_kv_heads=k))
        rows.append(
            f"| {k} | {sizes['self']:,.0f} | {sizes['cross']:,.0f} | {sizes['self'] / full:.3f} |"
        )
    return "\n".join(rows)


if __name__ == "__main__":
    print(
        f"d_model {BASE.d_model}, {BASE.num_heads} heads (H {BASE.head_dim}), "
        f"{BASE.num_layers} layers, cache dtype {np.dtype(BASE.dtype).name}"
    )
    print(table())
