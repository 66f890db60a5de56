"""Tiny GGUF files for the tests, written as llama.cpp's converter writes them, with
`gguf.GGUFWriter`: random Llama weights (q and k rows in llama.cpp's interleaved order,
matrices quantized with `gguf.quants.quantize`), and a byte-level BPE trained with the
`tokenizers` library on the King James Bible. Beside each file, optionally, the Hugging Face
directory of the same model in float32 (the dequantized weights in Hugging Face's layout):
what reading the file must give."""

from __future__ import annotations

import dataclasses
import json
import pathlib
from collections.abc import Mapping, Sequence

import gguf
import numpy as np

# Special tokens of the test vocabularies (SmolLM2's first three, ids 0-2) and a
# user-defined token (GGUF token type 4, matched whole like llama.cpp's).
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
USER_DEFINED = "<think>"
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
)


@dataclasses.dataclass(frozen=True)
class TinyGGUF:
    """A written file: its path, its model's config.json and its float32 tensors under
    Hugging Face names (`hf_dir`: where they were written as safetensors, or None)."""

    path: pathlib.Path
    hf_config: dict
    tensors: dict
    hf_dir: pathlib.Path | None


def train_bpe(texts: Sequence[str], vocab_size: int) -> tuple[list[str], list[str]]:
    """A byte-level BPE (GPT-2's regex, so digits merge too) trained on `texts`: its tokens
    in id order (the specials first) and its merges as 'left right'."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[*SPECIALS, USER_DEFINED],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    model = json.loads(tokenizer.to_str())["model"]
    tokens = sorted(model["vocab"], key=model["vocab"].get)
    assert [model["vocab"][t] for t in tokens] == list(range(len(tokens)))
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    return tokens, merges


def llama_weights(rng, *, vocab, width, layers, heads, kv_heads, ffn, tie) -> dict:
    """Random float32 weights of a Llama model in Hugging Face's names and layout."""
    head = width // heads

    def matrix(*shape):
        return (rng.standard_normal(shape) * 0.05).astype(np.float32)

    def norm():
        return (1.0 + 0.1 * rng.standard_normal(width)).astype(np.float32)

    tensors = {"model.embed_tokens.weight": matrix(vocab, width), "model.norm.weight": norm()}
    if not tie:
        tensors["lm_head.weight"] = matrix(vocab, width)
    for i in range(layers):
        p = f"model.layers.{i}."
        tensors |= {
            p + "input_layernorm.weight": norm(),
            p + "post_attention_layernorm.weight": norm(),
            p + "self_attn.q_proj.weight": matrix(heads * head, width),
            p + "self_attn.k_proj.weight": matrix(kv_heads * head, width),
            p + "self_attn.v_proj.weight": matrix(kv_heads * head, width),
            p + "self_attn.o_proj.weight": matrix(width, heads * head),
            p + "mlp.gate_proj.weight": matrix(ffn, width),
            p + "mlp.up_proj.weight": matrix(ffn, width),
            p + "mlp.down_proj.weight": matrix(width, ffn),
        }
    return tensors


# Hugging Face name -> llama.cpp's (the converter's tensor map for Llama).
GGUF_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
LAYER_NAMES = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def gguf_name(name: str) -> str:
    if name in GGUF_NAMES:
        return GGUF_NAMES[name]
    _, _, index, rest = name.split(".", 3)
    return f"blk.{index}.{LAYER_NAMES[rest.removesuffix('.weight')]}.weight"


def interleave_rows(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter's q/k row order: each head's two halves (rotate-half RoPE)
    interleaved pairwise (its RoPE rotates adjacent dimensions)."""
    rows, columns = weight.shape
    return (
        weight.reshape(heads, 2, rows // heads // 2, columns).swapaxes(1, 2).reshape(rows, columns)
    )


def write_gguf(
    path: pathlib.Path,
    tensors: Mapping[str, np.ndarray],
    hf_config: Mapping,
    tokens: Sequence[str],
    merges: Sequence[str],
    *,
    pre: str = "smollm",
    types: Mapping[str, str] | None = None,
    architecture: str = "llama",
    add_bos: bool = False,
    vocab_size: int | None = None,
    extra_tokens: int = 0,
) -> dict:
    """Writes a Llama GGUF file of float32 `tensors` (Hugging Face names and layout) and
    returns what reading it must give: each tensor dequantized, in Hugging Face's layout.

    Args:
        types: Hugging Face name -> GGML type name ('Q8_0', 'Q4_1', 'F16'...; default
            F32); a type without a quantizer in `gguf.quants` is written as random bytes.
        vocab_size: `llama.vocab_size` (default: the token count).
        extra_tokens: tokens appended to the list beyond the tensors' rows (a vocabulary
            that disagrees with the weights).
    """
    rng = np.random.default_rng(1)
    c = hf_config
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_name("tiny test model")
    writer.add_block_count(c["num_hidden_layers"])
    writer.add_context_length(c["max_position_embeddings"])
    writer.add_embedding_length(c["hidden_size"])
    writer.add_feed_forward_length(c["intermediate_size"])
    writer.add_head_count(c["num_attention_heads"])
    writer.add_head_count_kv(c["num_key_value_heads"])
    writer.add_rope_freq_base(c["rope_theta"])
    writer.add_layer_norm_rms_eps(c["rms_norm_eps"])
    writer.add_rope_dimension_count(c["hidden_size"] // c["num_attention_heads"])
    tokens = [*tokens, *(f"<extra_{i}>" for i in range(extra_tokens))]
    writer.add_vocab_size(len(tokens) if vocab_size is None else vocab_size)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(list(tokens))
    kinds = [gguf.TokenType.CONTROL if t in SPECIALS else gguf.TokenType.NORMAL for t in tokens]
    kinds[tokens.index(USER_DEFINED)] = gguf.TokenType.USER_DEFINED
    writer.add_token_types(kinds)
    writer.add_token_merges(list(merges))
    writer.add_bos_token_id(tokens.index("<|im_start|>"))
    writer.add_eos_token_id(tokens.index("<|im_end|>"))
    writer.add_unk_token_id(tokens.index("<|endoftext|>"))
    writer.add_pad_token_id(tokens.index("<|im_end|>"))
    writer.add_add_bos_token(add_bos)
    writer.add_chat_template(CHAT_TEMPLATE)
    expected = {}
    for name, value in tensors.items():
        type_name = (types or {}).get(name, "F32")
        qtype = gguf.GGMLQuantizationType[type_name]
        if name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = c["num_attention_heads" if "q_proj" in name else "num_key_value_heads"]
            stored = interleave_rows(value, heads)
        else:
            stored = value
        try:
            data = gguf.quants.quantize(stored, qtype)
        except NotImplementedError:  # no quantizer: random blocks of the right size
            shape = gguf.quants.quant_shape_to_byte_shape(stored.shape, qtype)
            data = rng.integers(0, 256, shape, dtype=np.uint8)
        writer.add_tensor(gguf_name(name), data, raw_dtype=qtype)
        with np.errstate(all="ignore"):  # random blocks may hold NaN scales
            stored_back = gguf.quants.dequantize(data, qtype).reshape(stored.shape)
        # Rows back in Hugging Face's order, through the inverse of llama.cpp's permutation
        # (stored row r is original row order[r]).
        if stored is not value:
            order = interleave_rows(np.arange(len(value), dtype=np.float32)[:, None], heads)
            stored_back = stored_back[np.argsort(order[:, 0].astype(int))]
        expected[name] = stored_back.astype(np.float32)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return expected


def tiny_config(*, vocab, width=64, layers=2, heads=4, kv_heads=2, ffn=128, max_len=128, tie=False):
    """The config.json of a tiny LlamaForCausalLM (transformers' keys)."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab,
        "hidden_size": width,
        "intermediate_size": ffn,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "hidden_act": "silu",
        "max_position_embeddings": max_len,
        "rms_norm_eps": float(np.float32(1e-5)),  # as a GGUF file holds it (float32)
        "rope_theta": 100000.0,
        "rope_parameters": {"rope_type": "default", "rope_theta": 100000.0},
        "tie_word_embeddings": tie,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "float32",
    }


def write_tiny_gguf(
    directory: pathlib.Path,
    tokens: Sequence[str],
    merges: Sequence[str],
    *,
    name: str = "tiny.gguf",
    tie: bool = False,
    hf_dir: bool = True,
    seed: int = 0,
    width: int = 64,
    ffn: int = 128,
    matrix_type: str | None = None,
    **options,
) -> TinyGGUF:
    """A 2-layer Llama GGUF file (width 64; embeddings Q8_0, matrices Q4_1, norms F32 unless
    `matrix_type` (every matrix) or `types` (by name) says otherwise) in `directory`, and its
    float32 Hugging Face directory (`directory/<name>.hf`) where `hf_dir`. `options` go to
    `write_gguf`."""
    directory.mkdir(parents=True, exist_ok=True)
    config = tiny_config(vocab=len(tokens), tie=tie, width=width, ffn=ffn)
    tensors = llama_weights(
        np.random.default_rng(seed),
        vocab=len(tokens),
        width=config["hidden_size"],
        layers=config["num_hidden_layers"],
        heads=config["num_attention_heads"],
        kv_heads=config["num_key_value_heads"],
        ffn=config["intermediate_size"],
        tie=tie,
    )
    default_types = {
        n: matrix_type or ("Q8_0" if "embed" in n or "lm_head" in n else "Q4_1")
        for n, t in tensors.items()
        if t.ndim == 2
    }
    options["types"] = default_types | options.get("types", {})
    expected = write_gguf(directory / name, tensors, config, tokens, merges, **options)
    out = None
    if hf_dir:
        from safetensors.numpy import save_file

        out = directory / f"{name}.hf"
        out.mkdir(exist_ok=True)
        save_file(expected, str(out / "model.safetensors"), metadata={"format": "pt"})
        (out / "config.json").write_text(json.dumps(config, indent=2))
    return TinyGGUF(directory / name, config, expected, out)
