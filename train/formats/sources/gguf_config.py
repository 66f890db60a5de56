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
import re
from collections.abc import Mapping
from typing import Any

from train.formats.sources.hf import HF_DEFAULTS, fail

# The architecture read (`general.architecture`): llama.cpp writes Llama, Mistral, SmolLM,
# TinyLlama... all as 'llama'.
ARCHITECTURE = "llama"

_TOP_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_TENSORS = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_LAYER_TENSOR = re.compile(r"blk\.(\d+)\.(\w+)\.weight")


def hf_name(path: pathlib.Path, name: str) -> str:
    """The Hugging Face name of the GGUF tensor `name` (the table above).

    Raises:
        ValueError: a tensor a Llama model here has no place for (named).
    """
    if name in _TOP_TENSORS:
        return _TOP_TENSORS[name]
    match = _LAYER_TENSOR.fullmatch(name)
    if match and match[2] in _LAYER_TENSORS:
        return f"model.layers.{match[1]}.{_LAYER_TENSORS[match[2]]}.weight"
    raise fail(
        path,
        f"holds tensor {name}, which a Llama model here has no place for (biases, experts "
        "and scaled-RoPE frequencies are not supported)",
    )


def hf_config(path: pathlib.Path, meta: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]]):
    """The `llama.*` metadata as a LlamaForCausalLM config.json (transformers' GGUF names)."""
    defaults = HF_DEFAULTS["llama"]

    def key(name: str, default: Any = None, *, required: bool = False) -> Any:
        value = meta.get(f"{ARCHITECTURE}.{name}", default)
        if value is None and required:
            raise fail(path, f"has no {ARCHITECTURE}.{name}: not a whole Llama GGUF file")
        return value

    if key("expert_count", 0):
        raise fail(
            path,
            f"is a mixture of experts ({ARCHITECTURE}.expert_count={key('expert_count')}); "
            "init_from reads dense Llama models",
        )
    width, heads = (
        key("embedding_length", required=True),
        key("attention.head_count", required=True),
    )
    head_dim = key("attention.key_length", width // heads)
    rotary = key("rope.dimension_count", head_dim)
    if rotary != head_dim:
        raise fail(
            path,
            f"rotates {rotary} of {head_dim} dimensions per head ({ARCHITECTURE}.rope."
            "dimension_count); init_from reads models with RoPE on whole heads",
        )
    scaling, theta = key("rope.scaling.type", "none"), float(key("rope.freq_base", 10000.0))
    # A scaled RoPE ('linear', 'yarn') goes to llama_config, which refuses it by name.
    rope = {"rope_type": "default" if scaling == "none" else scaling, "rope_theta": theta}
    vocab = _vocab_size(path, meta, shapes)
    tokens = meta["tokenizer.ggml.tokens"]

    def token_id(name: str) -> int | None:
        value = meta.get(f"tokenizer.ggml.{name}")
        return value if value is not None and 0 <= value < len(tokens) else None

    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab,
        "hidden_size": width,
        "intermediate_size": key("feed_forward_length", required=True),
        "num_hidden_layers": key("block_count", required=True),
        "num_attention_heads": heads,
        "num_key_value_heads": key("attention.head_count_kv", heads),
        "head_dim": head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": key("context_length", defaults["max_position_embeddings"]),
        "rms_norm_eps": float(key("attention.layer_norm_rms_epsilon", defaults["rms_norm_eps"])),
        "rope_theta": theta,  # read by transformers < 5
        "rope_parameters": rope,
        "tie_word_embeddings": "lm_head.weight" not in shapes,
        "attention_bias": False,
        "mlp_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": token_id("bos_token_id"),
        "eos_token_id": token_id("eos_token_id"),
        "pad_token_id": token_id("padding_token_id"),
        "torch_dtype": "float32",
    }


def _vocab_size(path: pathlib.Path, meta: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]]):
    """The vocabulary V: the token list's length, which the embedding table (and the
    output layer, and `llama.vocab_size` where present) must agree with.

    Raises:
        ValueError: no token list, or a count that disagrees (both named).
    """
    tokens = meta.get("tokenizer.ggml.tokens")
    if not tokens:
        raise fail(path, "has no tokenizer.ggml.tokens: init_from needs the model's vocabulary")
    vocab = len(tokens)
    if "model.embed_tokens.weight" not in shapes:
        raise fail(path, "has no token_embd.weight: not a whole Llama GGUF file")
    counts = [(f"{ARCHITECTURE}.vocab_size is {{}}", meta.get(f"{ARCHITECTURE}.vocab_size"))]
    for hf_name, gguf_name in (
        ("model.embed_tokens.weight", "token_embd.weight"),
        ("lm_head.weight", "output.weight"),
    ):
        if hf_name in shapes:
            counts.append((f"{gguf_name} has {{}} rows", shapes[hf_name][0]))
    for what, count in counts:
        if count is not None and count != vocab:
            raise fail(
                path,
                f"its vocabulary (tokenizer.ggml.tokens) has {vocab} tokens but "
                f"{what.format(count)}: the tokenizer does not belong to these weights; "
                "convert the model again (llama.cpp's convert_hf_to_gguf.py)",
            )
    return vocab
