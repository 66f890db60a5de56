"""flax_transformer: the Transformer of "Attention Is All You Need" in JAX and Flax linen.

Layers of the package (imports point down only):
  models      Transformer (encoder-decoder), DecoderOnlyTransformer (GPT-style LM)
  blocks      EncoderLayer, DecoderLayer, Encoder, Decoder
  layers      LayerNorm, MultiHeadAttention, FeedForward, Embed, PositionalEncoding
  functional  pure jnp formulas: attention, masks, layer norm, positions, feed-forward
  config      TransformerConfig

Dimension key used in names (`x_BTD`) and einsum strings:
  B batch, T target/query length, S source/key length, D model width, N heads,
  H head width (D / N), F feed-forward width, V vocabulary size.
"""

from flax_transformer.blocks import Decoder, DecoderLayer, Encoder, EncoderLayer
from flax_transformer.config import TransformerConfig
from flax_transformer.functional import (
    causal_mask,
    combine_masks,
    dot_product_attention,
    feed_forward,
    layer_norm,
    multi_head_attention,
    padding_mask,
    simple_self_attention,
    sinusoidal_positions,
)
from flax_transformer.layers import (
    Embed,
    FeedForward,
    LayerNorm,
    MultiHeadAttention,
    PositionalEncoding,
)
from flax_transformer.models import DecoderOnlyTransformer, Transformer, check_tokens

__version__ = "0.1.0"

__all__ = [
    "Decoder",
    "DecoderLayer",
    "DecoderOnlyTransformer",
    "Embed",
    "Encoder",
    "EncoderLayer",
    "FeedForward",
    "LayerNorm",
    "MultiHeadAttention",
    "PositionalEncoding",
    "Transformer",
    "TransformerConfig",
    "causal_mask",
    "check_tokens",
    "combine_masks",
    "dot_product_attention",
    "feed_forward",
    "layer_norm",
    "multi_head_attention",
    "padding_mask",
    "simple_self_attention",
    "sinusoidal_positions",
]
