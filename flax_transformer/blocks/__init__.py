"""Encoder and decoder layers (`layers`) and the stacks built from them (`stacks`).

Each sublayer sits in a residual branch. Pre-norm (default, Happy-LLM ch. 2 / GPT-2):
    x = x + Dropout(Sublayer(LayerNorm(x)))
Post-norm (the 2017 paper, `norm_position='post'`):
    x = LayerNorm(x + Dropout(Sublayer(x)))
A pre-norm stack ends with one more LayerNorm; a post-norm stack needs none (config
`final_norm=True` adds it, as torch.nn.Transformer has).

Every level takes `deterministic` by keyword (default True: no dropout); dropout draws
from the 'dropout' rng stream.
"""

from flax_transformer.blocks.layers import DecoderLayer, EncoderLayer
from flax_transformer.blocks.stacks import Decoder, Encoder

__all__ = ["Decoder", "DecoderLayer", "Encoder", "EncoderLayer"]
