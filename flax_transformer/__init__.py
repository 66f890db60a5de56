"""flax_transformer: the Transformer of "Attention Is All You Need" in JAX and Flax linen.

Layers of the package (imports point down only: a module imports only from those below it):
  interop     weights in from torch.nn.Transformer, Hugging Face GPT-2 and Llama, out to
              GPT-2 and Llama (torch optional); builds the models below
  decoding    KV-cache generation: generate_translation, generate_text, and the strategies
              Greedy, Sample, Beam (drives the model it is given through the cache)
  models      Transformer (encoder-decoder), DecoderOnlyTransformer (GPT-style LM)
  cache       the KV cache pytree the models read and write (init_cache, check_cache_room,
              select_rows); decoding builds its loops on it
  blocks      EncoderLayer, DecoderLayer, Encoder, Decoder
  layers      LayerNorm, RMSNorm, MultiHeadAttention, FeedForward, Embed, PositionalEncoding
  functional  pure jnp formulas: attention, masks, norms, positions (incl. RoPE), feed-forward
  config      TransformerConfig, LayerConfig (the fields one encoder/decoder layer reads)
  checks      every input check, one home (arguments, traced and `checked`, tokens,
              generation); the ground floor: it imports nothing else of the library, and
              only `generation` imports flax, so functional may use the rest
Beside them: axes (logical axis names, imported by layers and blocks), sharding (meshes, the
rules mapping those names to mesh axes, and mesh_rules / on_mesh, which trace a step under
them) and lora
(merge_lora, lora_mask, lora_param_count over a parameter tree; imports config and
functional; the adapters themselves are `layers.lora`) and optim (muon_partition,
muon_dimension_numbers: the matrices `optax.contrib.muon` should orthogonalise).

Dimension key used in names (`x_BTD`) and einsum strings:
  B batch, T target/query length, S source/key length, D model width, N heads,
  K key/value heads (grouped-query attention; K = N by default), H head width (D / N),
  F feed-forward width, V vocabulary size.
"""

from flax_transformer.blocks import Decoder, DecoderLayer, Encoder, EncoderLayer
from flax_transformer.checks.traced import checked
from flax_transformer.config import LayerConfig, TransformerConfig
from flax_transformer.decoding import Beam, Greedy, Sample, generate_text, generate_translation
from flax_transformer.functional import (
    apply_rope,
    causal_mask,
    combine_masks,
    dot_product_attention,
    feed_forward,
    gated_feed_forward,
    label_smoothed_cross_entropy,
    layer_norm,
    multi_head_attention,
    padding_mask,
    rms_norm,
    segment_mask,
    segment_positions,
    simple_self_attention,
    sinusoidal_positions,
)
from flax_transformer.interop import (
    config_from_torch,
    decoder_only_params_from_torch_encoder,
    export_gpt2,
    export_llama,
    gpt2_config,
    llama_config,
    load_gpt2,
    load_llama,
    transformer_params_from_torch,
)
from flax_transformer.interop.gguf import read_gguf, write_gguf
from flax_transformer.interop.gguf_vocab import GGUFVocab
from flax_transformer.layers import (
    Embed,
    FeedForward,
    LayerNorm,
    MultiHeadAttention,
    PositionalEncoding,
    RMSNorm,
)
from flax_transformer.lora import lora_mask, lora_param_count, merge_lora
from flax_transformer.models import DecoderOnlyTransformer, Transformer, check_tokens
from flax_transformer.optim import muon_dimension_numbers, muon_partition
from flax_transformer.sharding import mesh_rules, on_mesh

__version__ = "0.1.0"

__all__ = [
    "Beam",
    "Decoder",
    "DecoderLayer",
    "DecoderOnlyTransformer",
    "Embed",
    "Encoder",
    "EncoderLayer",
    "FeedForward",
    "GGUFVocab",
    "Greedy",
    "LayerConfig",
    "LayerNorm",
    "MultiHeadAttention",
    "PositionalEncoding",
    "RMSNorm",
    "Sample",
    "Transformer",
    "TransformerConfig",
    "apply_rope",
    "causal_mask",
    "check_tokens",
    "checked",
    "combine_masks",
    "config_from_torch",
    "decoder_only_params_from_torch_encoder",
    "dot_product_attention",
    "export_gpt2",
    "export_llama",
    "feed_forward",
    "gated_feed_forward",
    "generate_text",
    "generate_translation",
    "gpt2_config",
    "label_smoothed_cross_entropy",
    "layer_norm",
    "llama_config",
    "load_gpt2",
    "load_llama",
    "lora_mask",
    "lora_param_count",
    "merge_lora",
    "mesh_rules",
    "multi_head_attention",
    "muon_dimension_numbers",
    "muon_partition",
    "on_mesh",
    "padding_mask",
    "read_gguf",
    "rms_norm",
    "segment_mask",
    "segment_positions",
    "simple_self_attention",
    "sinusoidal_positions",
    "transformer_params_from_torch",
    "write_gguf",
]
