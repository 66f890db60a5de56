"""The layout of a Llama-family GGUF file in our terms: tensor names, llama.cpp's row order of
q and k, the `llama.*` metadata as a `LlamaForCausalLM` config, and reading the metadata and
one tensor at a time with the `gguf` package (imported when called). `read_gguf` and
`write_gguf` (`flax_transformer.interop.gguf`) are built on these; the training program's
GGUF source uses them too.

    token_embd (V, D)                     Hugging Face model.embed_tokens
    blk.i.attn_norm, ffn_norm (D,)        layers.i.input_layernorm, post_attention_layernorm
    blk.i.attn_q, attn_k, attn_v, attn_output
                                          layers.i.self_attn.{q,k,v,o}_proj
    blk.i.ffn_gate, ffn_up, ffn_down      layers.i.mlp.{gate,up,down}_proj
    output_norm (D,), output (V, D)       model.norm, lm_head (absent: tied embeddings)

Tensors are `(rows, columns)`, as `torch.nn.Linear` weights.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

# The architecture read and written (`general.architecture`).
ARCHITECTURE = "llama"
# Tensor types read (dequantized by `gguf.quants`): floats, block formats and k-quants.
READ_TYPES = (
    "F32",
    "F16",
    "BF16",
    "Q8_0",
    "Q4_0",
    "Q4_1",
    "Q5_0",
    "Q5_1",
    "Q2_K",
    "Q3_K",
    "Q4_K",
    "Q5_K",
    "Q6_K",
)
# `write_gguf(type=...)` -> the GGML type of the matrices, and `general.file_type`
# (llama.cpp's LlamaFileType). Norm scales are always F32, as llama.cpp's converter writes.
WRITE_TYPES = {
    "f32": ("F32", "ALL_F32"),
    "f16": ("F16", "MOSTLY_F16"),
    "bf16": ("BF16", "MOSTLY_BF16"),
    "q8_0": ("Q8_0", "MOSTLY_Q8_0"),
}
# Defaults of keys a file may leave out (transformers' LlamaConfig defaults).
DEFAULT_CONTEXT = 2048
DEFAULT_RMS_EPS = 1e-6
DEFAULT_ROPE_BASE = 10000.0

TOP_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
LAYER_TENSORS = {
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
_HF_LAYER_TENSOR = re.compile(r"model\.layers\.(\d+)\.(.+)\.weight")
_GGUF_LAYER_NAMES = {hf: gguf_name for gguf_name, hf in LAYER_TENSORS.items()}


def hf_tensor_name(name: str) -> str:
    """The Hugging Face name of the GGUF tensor `name` (the module docstring's table).

    Raises:
        ValueError: a tensor a Llama model here has no place for (named).
    """
    if name in TOP_TENSORS:
        return TOP_TENSORS[name]
    match = _LAYER_TENSOR.fullmatch(name)
    if match and match[2] in LAYER_TENSORS:
        return f"model.layers.{match[1]}.{LAYER_TENSORS[match[2]]}.weight"
    raise ValueError(
        f"holds tensor {name}, which a Llama model here has no place for (biases, experts "
        "and scaled-RoPE frequencies are not supported)"
    )


def gguf_tensor_name(hf_name: str) -> str:
    """The GGUF name of a Hugging Face Llama tensor name (the inverse of `hf_tensor_name`)."""
    for gguf_name, name in TOP_TENSORS.items():
        if name == hf_name:
            return gguf_name
    match = _HF_LAYER_TENSOR.fullmatch(hf_name)
    return f"blk.{match[1]}.{_GGUF_LAYER_NAMES[match[2]]}.weight"


def to_llama_cpp_rows(weight: np.ndarray, heads: int) -> np.ndarray:
    """q_proj / k_proj `(heads * H, D)` rows in llama.cpp's order: each head's two halves
    interleaved pairwise (row (h, pair, i) -> (h, i, pair))."""
    rows, columns = weight.shape
    split = weight.reshape(heads, 2, rows // heads // 2, columns)
    return split.swapaxes(1, 2).reshape(rows, columns)


def from_llama_cpp_rows(weight: np.ndarray, heads: int) -> np.ndarray:
    """The inverse of `to_llama_cpp_rows`: llama.cpp's q / k rows in Hugging Face's order."""
    rows, columns = weight.shape
    split = weight.reshape(heads, rows // heads // 2, 2, columns)
    return split.swapaxes(1, 2).reshape(rows, columns)


def llama_hf_config_from_gguf(
    meta: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]]
) -> dict[str, Any]:
    """A GGUF file's `llama.*` metadata as a `LlamaForCausalLM` config.json (the keys
    transformers' GGUF loader gives).

    Args:
        meta: the file's metadata (key -> value).
        shapes: Hugging Face tensor name -> `(rows, columns)`.

    Raises:
        ValueError: another architecture, a mixture of experts, RoPE on part of each head,
            a missing key, or a vocabulary that disagrees with the tensors (named).
    """
    architecture = meta.get("general.architecture")
    if architecture != ARCHITECTURE:
        raise ValueError(
            f"architecture {architecture!r} is not supported; the GGUF reader reads files of "
            f"the Llama family ({ARCHITECTURE!r})"
        )

    def key(name: str, default: Any = None, *, required: bool = False) -> Any:
        value = meta.get(f"{ARCHITECTURE}.{name}", default)
        if value is None and required:
            raise ValueError(f"has no {ARCHITECTURE}.{name}: not a whole Llama GGUF file")
        return value

    if key("expert_count", 0):
        raise ValueError(
            f"is a mixture of experts ({ARCHITECTURE}.expert_count={key('expert_count')}); "
            "only dense Llama models are read"
        )
    width = key("embedding_length", required=True)
    heads = key("attention.head_count", required=True)
    head_dim = key("attention.key_length", width // heads)
    rotary = key("rope.dimension_count", head_dim)
    if rotary != head_dim:
        raise ValueError(
            f"rotates {rotary} of {head_dim} dimensions per head ({ARCHITECTURE}.rope."
            "dimension_count); only models with RoPE on whole heads are read"
        )
    scaling = key("rope.scaling.type", "none")
    theta = float(key("rope.freq_base", DEFAULT_ROPE_BASE))
    vocab = _vocab_size(meta, shapes)
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
        "max_position_embeddings": key("context_length", DEFAULT_CONTEXT),
        "rms_norm_eps": float(key("attention.layer_norm_rms_epsilon", DEFAULT_RMS_EPS)),
        "rope_theta": theta,  # read by transformers < 5
        # A scaled RoPE ('linear', 'yarn') goes to llama_config, which refuses it by name.
        "rope_parameters": {
            "rope_type": "default" if scaling == "none" else scaling,
            "rope_theta": theta,
        },
        "tie_word_embeddings": "lm_head.weight" not in shapes,
        "attention_bias": False,
        "mlp_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": token_id("bos_token_id"),
        "eos_token_id": token_id("eos_token_id"),
        "pad_token_id": token_id("padding_token_id"),
        "torch_dtype": "float32",
    }


def _vocab_size(meta: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]]) -> int:
    """V: the token list's length, which the embedding (and output layer, and
    `llama.vocab_size` where present) must agree with."""
    tokens = meta.get("tokenizer.ggml.tokens")
    if not tokens:
        raise ValueError("has no tokenizer.ggml.tokens: the model's vocabulary is missing")
    vocab = len(tokens)
    if "model.embed_tokens.weight" not in shapes:
        raise ValueError("has no token_embd.weight: not a whole Llama GGUF file")
    counts = [(f"{ARCHITECTURE}.vocab_size is {{}}", meta.get(f"{ARCHITECTURE}.vocab_size"))]
    for gguf_name in ("token_embd.weight", "output.weight"):
        if TOP_TENSORS[gguf_name] in shapes:
            counts.append((f"{gguf_name} has {{}} rows", shapes[TOP_TENSORS[gguf_name]][0]))
    for what, count in counts:
        if count is not None and count != vocab:
            raise ValueError(
                f"its vocabulary (tokenizer.ggml.tokens) has {vocab} tokens but "
                f"{what.format(count)}: the tokenizer does not belong to these weights; "
                "convert the model again (llama.cpp's convert_hf_to_gguf.py)"
            )
    return vocab


class TensorInfo(NamedTuple):
    """Where a tensor's bytes are: its GGUF name and type, its shape (rows first, as
    `gguf.quants.dequantize` returns it), the byte offset in the file and the byte count."""

    gguf_name: str
    type_name: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int


def read_metadata(path: str | os.PathLike) -> tuple[dict[str, Any], dict[str, TensorInfo]]:
    """A GGUF file's metadata (key -> value) and tensor table (GGUF name -> `TensorInfo`).
    The reader is dropped before returning: the tensors are read one at a time, by
    `read_tensor`.

    Raises:
        ValueError: not readable as GGUF (truncated, damaged, or a newer format), one line
            without the path (the callers name it).
    """
    import importlib.metadata

    import gguf

    try:
        reader = gguf.GGUFReader(path)
    except Exception as err:  # the reader raises ValueError, KeyError, IndexError...
        reason = f"{type(err).__name__}: {err}"
        if "GGMLQuantizationType" in str(err) or "version" in str(err):
            raise ValueError(
                f"cannot be read by gguf {importlib.metadata.version('gguf')} ({reason}): a "
                "newer format or tensor type; upgrade gguf (pip install -U gguf)"
            ) from None
        raise ValueError(
            f"cannot be read as a GGUF file ({reason}): it is truncated or damaged; copy or "
            "download it again"
        ) from None
    meta = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    table = {
        t.name: TensorInfo(
            t.name,
            t.tensor_type.name,
            tuple(int(n) for n in reversed(t.shape.tolist())),
            int(t.data_offset),
            int(t.n_bytes),
        )
        for t in reader.tensors
    }
    return meta, table


def read_tensor(path: str | os.PathLike, info: TensorInfo, heads: int | None = None) -> np.ndarray:
    """One tensor of the file in float32 (`info.shape`), dequantized by `gguf.quants`; with
    `heads`, an attn_q / attn_k matrix's rows put back in Hugging Face's order
    (`from_llama_cpp_rows`).

    Raises:
        ValueError: the file ends before the tensor's bytes do (truncated).
    """
    import gguf

    qtype = gguf.GGMLQuantizationType[info.type_name]
    with open(path, "rb") as f:
        f.seek(info.offset)
        raw = np.fromfile(f, np.uint8, info.nbytes)
    if raw.size != info.nbytes:
        raise ValueError(
            f"ends inside tensor {info.gguf_name} (truncated): copy or download it again"
        )
    raw = raw.reshape(gguf.quants.quant_shape_to_byte_shape(info.shape, qtype))
    array = gguf.quants.dequantize(raw, qtype).astype(np.float32, copy=False).reshape(info.shape)
    return array if heads is None else from_llama_cpp_rows(array, heads)
