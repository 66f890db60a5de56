"""Weight importers from torch models (torch and transformers are never imported here).

torch_transformer  `torch.nn.Transformer` -> `Transformer`; causal `nn.TransformerEncoder`
                   -> `DecoderOnlyTransformer`; `config_from_torch` builds the config
gpt2               Hugging Face GPT-2 (model object or local directory) -> `DecoderOnlyTransformer`
export             `DecoderOnlyTransformer` -> Hugging Face GPT-2 directory (safetensors + config)
llama              Hugging Face Llama/Mistral <-> `DecoderOnlyTransformer` (RMSNorm, RoPE, SwiGLU,
                   grouped-query attention)
gguf               GGUF files (llama.cpp, Ollama) <-> `DecoderOnlyTransformer` (the `gguf`
                   package is imported when called); gguf_layout: names, metadata, tensors;
                   gguf_vocab: `GGUFVocab`, the tokenizer
"""

from flax_transformer.interop.export import export_gpt2, gpt2_hf_config, gpt2_tensors
from flax_transformer.interop.gguf import read_gguf, write_gguf
from flax_transformer.interop.gguf_vocab import GGUFVocab
from flax_transformer.interop.gpt2 import gpt2_config, load_gpt2
from flax_transformer.interop.llama import (
    export_llama,
    llama_config,
    llama_hf_config,
    llama_tensors,
    load_llama,
)
from flax_transformer.interop.torch_transformer import (
    config_from_torch,
    decoder_only_params_from_torch_encoder,
    transformer_params_from_torch,
)

__all__ = [
    "GGUFVocab",
    "config_from_torch",
    "decoder_only_params_from_torch_encoder",
    "export_gpt2",
    "gpt2_config",
    "gpt2_hf_config",
    "gpt2_tensors",
    "llama_config",
    "llama_hf_config",
    "llama_tensors",
    "export_llama",
    "load_llama",
    "load_gpt2",
    "read_gguf",
    "transformer_params_from_torch",
    "write_gguf",
]
