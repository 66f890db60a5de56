"""Flax linen layers: thin modules that declare parameters and call `functional`."""

from flax_transformer.layers.attention import MultiHeadAttention
from flax_transformer.layers.dropout import Dropout
from flax_transformer.layers.embeddings import Embed, PositionalEncoding
from flax_transformer.layers.feed_forward import FeedForward
from flax_transformer.layers.norm import LayerNorm, RMSNorm

__all__ = [
    "Dropout",
    "Embed",
    "FeedForward",
    "LayerNorm",
    "MultiHeadAttention",
    "PositionalEncoding",
    "RMSNorm",
]
