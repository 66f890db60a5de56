"""A GGUF file's `llama.*` metadata and tensor names in Hugging Face's terms: the
`config.json` of a `LlamaForCausalLM` (the keys transformers' GGUF loader gives), and each
tensor's Hugging Face name. Other architectures, mixtures of experts, partial rotary
dimensions and tensors a Llama model here has no place for are refused by name.

    GGUF tensor (rows, columns)            Hugging Face name
    token_embd.weight (V, D)               model.embed_tokens.weight
    blk.i.attn_norm, ffn_norm (D,)         model.layers.i.input_layernorm, post_attention_layernorm
    blk.i.attn_q, attn_k, attn_v, attn_output
                                           model.layers.i.self_attn.{q,k,v,o}_proj
    blk.i.ffn_gate, ffn_up, ffn_down       model.layers.i.mlp.{gate,up,down}_proj
    output_norm (D,), output (V, D)        model.norm, lm_head (none: tied embeddings)
"""

from __future__ import annotations

import pathlib
from collections.abc import Mapping
from typing import Any

from flax_transformer.interop import gguf_layout as library_gguf
from train.formats.sources.hf import fail

# The architecture read (`general.architecture`): llama.cpp writes Llama, Mistral, SmolLM,
# TinyLlama... all as 'llama'.
ARCHITECTURE = library_gguf.ARCHITECTURE


def hf_name(path: pathlib.Path, name: str) -> str:
    """The Hugging Face name of the GGUF tensor `name` (the table above;
    `flax_transformer.interop.gguf_layout.hf_tensor_name`).

    Raises:
        ValueError: a tensor a Llama model here has no place for (named).
    """
    try:
        return library_gguf.hf_tensor_name(name)
    except ValueError as err:
        raise fail(path, str(err)) from None


def hf_config(path: pathlib.Path, meta: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]]):
    """The `llama.*` metadata as a LlamaForCausalLM config.json (transformers' GGUF names;
    `flax_transformer.interop.gguf_layout.llama_hf_config_from_gguf`).

    Raises:
        ValueError: a mixture of experts, partial RoPE, a missing key or a vocabulary that
            disagrees with the tensors; one line naming the file.
    """
    try:
        return library_gguf.llama_hf_config_from_gguf(meta, shapes)
    except ValueError as err:
        raise fail(path, str(err)) from None
