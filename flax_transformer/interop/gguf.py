"""GGUF files (llama.cpp's format, what Ollama and LM Studio run) in and out of
`DecoderOnlyTransformer`, with the `gguf` package (llama.cpp's own reader and writer,
imported when called).

`read_gguf(path)` gives `(config, variables, vocab, chat_template)` of a Llama-family file
(`general.architecture` 'llama': Llama, Mistral, SmolLM, TinyLlama...); `write_gguf` writes
one that llama.cpp runs. The tensor names, the metadata and the reading of single tensors
are in `flax_transformer.interop.gguf_layout`.

llama.cpp's RoPE rotates adjacent pairs of dimensions, Hugging Face's (and ours) the two
halves of a head: llama.cpp's converter reorders the rows of attn_q and attn_k within each
head so that head h's row (h, pair, i) goes to (h, i, pair); `write_gguf` does the same and
`read_gguf` undoes it.

The vocabulary is exactly the file's (`GGUFVocab`, V tokens). Our models mask `pad_id` keys
and every id of a GGUF vocabulary is a real token, so the config `read_gguf` returns names
a real token as `pad_id` (the file's padding id where it has one): text holding that token
is attended to differently from llama.cpp. The training program reads GGUF files with an
added pad id V instead (`vocab_size` V + 1), as `load_llama` does, and `train.export`
removes it again before writing.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import types
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from flax_transformer.config import TransformerConfig
from flax_transformer.interop._util import dummy_tokens
from flax_transformer.interop.gguf_layout import (
    ARCHITECTURE,
    READ_TYPES,
    WRITE_TYPES,
    gguf_tensor_name,
    hf_tensor_name,
    llama_hf_config_from_gguf,
    read_metadata,
    read_tensor,
    to_llama_cpp_rows,
)
from flax_transformer.interop.gguf_vocab import GGUFVocab
from flax_transformer.interop.llama import _layer_params, llama_config, llama_tensors
from flax_transformer.models import DecoderOnlyTransformer


def read_gguf(
    path: str | os.PathLike, *, pad_id: int | None = None, **config_overrides
) -> tuple[TransformerConfig, dict, GGUFVocab, str | None]:
    """Read a Llama-family GGUF file: model, weights (dequantized to float32), vocabulary
    and chat template.

    The vocabulary is exactly the file's: `config.vocab_size` is its V, with no pad id
    added (the training program adds one, id V, when it fine-tunes from a GGUF file).
    `config.pad_id` is then a real token, whose keys our model masks: `pad_id` if given,
    else the file's padding id, else its EOS id, else 0.

    Args:
        path: the .gguf file.
        pad_id: the id to mask as padding (see above).
        **config_overrides: fields of the returned config to change (`scan_layers=True`,
            `param_dtype='bfloat16'`, ...).

    Returns:
        `(config, variables, vocab, chat_template)`:
        `DecoderOnlyTransformer(config).apply(variables, tokens_BT)` gives logits
        `(B, T, V)`; `vocab.tokenizer()` is the `tokenizers.Tokenizer` that encodes as
        llama.cpp does; `chat_template` is `tokenizer.chat_template` (None if absent).

    Raises:
        ValueError: not a readable GGUF file, another architecture, a tensor type not
            dequantized here, a vocabulary kind not read here, or one that disagrees with
            the weights; one line naming the file and the reason.
    """
    try:
        meta, table = read_metadata(path)
        tensors = {hf_tensor_name(name): info for name, info in table.items()}
        for info in table.values():
            if info.type_name not in READ_TYPES:
                raise ValueError(
                    f"tensor {info.gguf_name} is {info.type_name}, a type not dequantized "
                    f"here ({', '.join(READ_TYPES)}); requantize the model to one of them"
                )
        shapes = {name: info.shape for name, info in tensors.items()}
        hf_config = llama_hf_config_from_gguf(meta, shapes)
        vocab = GGUFVocab.from_metadata(meta)
        chosen = [pad_id, vocab.pad_id, vocab.eos_id, 0]
        exact = {"vocab_size": len(vocab), "pad_id": next(i for i in chosen if i is not None)}
        overrides = exact | config_overrides
        config = llama_config(types.SimpleNamespace(**hf_config), **overrides)
    except ValueError as err:
        raise ValueError(f"{os.fspath(path)}: {err}") from None
    heads = {"q_proj": config.num_heads, "k_proj": config.kv_heads}

    def read(name: str) -> np.ndarray:
        kind = name.rsplit(".", 2)[-2]
        if name not in tensors:
            raise ValueError(
                f"{os.fspath(path)}: has no tensor {gguf_tensor_name(name)}: not a whole "
                "Llama GGUF file"
            )
        try:
            return read_tensor(path, tensors[name], heads.get(kind))
        except ValueError as err:
            raise ValueError(f"{os.fspath(path)}: {err}") from None

    def module(prefix: str, names: tuple[str, ...]) -> types.SimpleNamespace:
        return types.SimpleNamespace(
            **{n: types.SimpleNamespace(weight=read(f"{prefix}.{n}.weight")) for n in names}
        )

    # Each layer goes to the device in param_dtype as soon as it is read: the host holds one
    # layer in float32 at a time beside the parameters (as the training program's loader).
    def place(tree: Any) -> Any:
        return jax.tree.map(lambda x: jnp.asarray(x, dtype=config.param_dtype), tree)

    # The largest tensors first, while the host holds little else: their dequantization's
    # temporaries do not add to a whole model's parameters.
    embedding = place(read("model.embed_tokens.weight"))
    top = {"final_norm": {"scale": place(read("model.norm.weight"))}}
    if not config.tie_output_embedding:
        top["logits"] = {"kernel": place(read("lm_head.weight").T)}
    layers = []
    for i in range(config.decoder_layers):
        prefix = f"model.layers.{i}"
        layer = types.SimpleNamespace(
            self_attn=module(f"{prefix}.self_attn", ("q_proj", "k_proj", "v_proj", "o_proj")),
            mlp=module(f"{prefix}.mlp", ("gate_proj", "up_proj", "down_proj")),
            **module(prefix, ("input_layernorm", "post_attention_layernorm")).__dict__,
        )
        layers.append(place(_layer_params(layer, config, f"layers.{i}")))
    if config.scan_layers:  # the layout nn.scan gives its parameters: (L, ...) per leaf
        decoder = {"layers": jax.tree.map(lambda *xs: jnp.stack(xs), *layers)}
    else:
        decoder = {f"layers_{i}": layer for i, layer in enumerate(layers)}
    del layers
    decoder |= top
    params = {"embed": {"embedding": embedding}, "decoder": decoder}
    _check_tree(params, config)
    return config, {"params": params}, vocab, meta.get("tokenizer.chat_template")


def _check_tree(params: dict, config: TransformerConfig) -> None:
    """ValueError unless `params` has the paths and shapes `DecoderOnlyTransformer(config)`
    builds. Traced with one layer (each layer's tree is the same), not all of them: the
    check `finish_params` makes, at a thirtieth of the tracing for a 30-layer model."""
    from flax import traverse_util

    one = dataclasses.replace(config, num_layers=1, num_decoder_layers=None, scan_layers=False)
    shapes = jax.eval_shape(lambda: _param_shapes(one))
    want = {}
    for path, struct in traverse_util.flatten_dict(shapes, sep="/").items():
        if not path.startswith("decoder/layers_0/"):
            want[path] = struct.shape
            continue
        rest = path.removeprefix("decoder/layers_0/")
        if config.scan_layers:
            want[f"decoder/layers/{rest}"] = (config.decoder_layers, *struct.shape)
        else:
            want |= {
                f"decoder/layers_{i}/{rest}": struct.shape for i in range(config.decoder_layers)
            }
    have = {k: v.shape for k, v in traverse_util.flatten_dict(params, sep="/").items()}
    wrong = sorted(k for k in set(want) | set(have) if want.get(k) != have.get(k))
    if wrong:
        shown = ", ".join(f"{k} {have.get(k)} (the model: {want.get(k)})" for k in wrong[:4])
        raise ValueError(f"read_gguf: the file's tensors do not fit the config: {shown}")


def _param_shapes(config: TransformerConfig) -> dict:
    """The 'params' tree `DecoderOnlyTransformer(config).init` builds (call under
    `jax.eval_shape`)."""
    from flax import linen as nn

    model = DecoderOnlyTransformer(config)
    return nn.unbox(model.init(jax.random.key(0), dummy_tokens()))["params"]


def write_gguf(
    path: str | os.PathLike,
    config: TransformerConfig,
    variables: Any,
    vocab: GGUFVocab,
    chat_template: str | None = None,
    *,
    type: str = "f16",
    name: str | None = None,
) -> pathlib.Path:
    """Write a Llama-family `DecoderOnlyTransformer` as a GGUF file llama.cpp runs.

    What llama.cpp's converter (`convert_hf_to_gguf.py`) writes for a `LlamaForCausalLM`:
    the `llama.*` architecture keys, the vocabulary (`vocab.metadata()`), the chat
    template, q and k rows in llama.cpp's order (the module docstring), `output.weight`
    only for an untied head. Matrices in `type`; norm scales in F32; with 'q8_0', a matrix
    whose rows are not a whole number of 32-value blocks is written F16, as the converter
    does. The file is written beside `path` under a temporary name and renamed when whole.

    Args:
        path: the .gguf file to write (replaced if it exists).
        config: RMSNorm, RoPE, SwiGLU, pre-norm, no biases, unscaled embeddings, no QK-norm
            and no LoRA (merge it first: `flax_transformer.merge_lora`).
        variables: `{'params': ...}` of `DecoderOnlyTransformer(config)` (scanned or not).
        vocab: the V tokens of the model's tokenizer (`config.vocab_size` == V; a model with
            an added pad id must drop it first), e.g. `GGUFVocab.from_tokenizer(...)`.
        chat_template: the Jinja chat template (`tokenizer.chat_template`), or None.
        type: 'f32', 'f16', 'bf16' or 'q8_0' (`WRITE_TYPES`).
        name: `general.name` (default: the file's stem).

    Returns:
        The file's path.

    Raises:
        ValueError: a model llama.cpp's 'llama' architecture cannot run (named), a
            vocabulary of another size, or an unknown type; raised before anything is
            written.
    """
    if type not in WRITE_TYPES:
        raise ValueError(f"write_gguf: type={type!r}; choose one of {sorted(WRITE_TYPES)}.")
    if not isinstance(vocab, GGUFVocab):
        raise ValueError(
            f"write_gguf: vocab is a {vocab.__class__.__name__}; pass a GGUFVocab "
            "(GGUFVocab.from_tokenizer(tokenizer, ...) for a Hugging Face tokenizer)."
        )
    tensors = llama_tensors(config, variables, caller="write_gguf")
    if config.activation != "swiglu":
        raise ValueError(
            f"write_gguf: activation={config.activation!r}; llama.cpp's 'llama' architecture "
            "runs SwiGLU (SiLU-gated) feed-forwards only."
        )
    if config.vocab_size != len(vocab):
        raise ValueError(
            f"write_gguf: the model has vocab_size={config.vocab_size} but the vocabulary "
            f"{len(vocab)} tokens; a model with an added pad id must drop that row first "
            "(train.export does)."
        )
    import gguf

    matrix_type, file_type = WRITE_TYPES[type]
    heads = {"q_proj": config.num_heads, "k_proj": config.kv_heads}
    encoded = {}
    for hf_name in list(tensors):
        array = tensors.pop(hf_name)  # the float32 copy goes once encoded
        kind = hf_name.rsplit(".", 2)[-2]
        if kind in heads:
            array = to_llama_cpp_rows(array, heads[kind])
        qtype = gguf.GGMLQuantizationType[matrix_type if array.ndim == 2 else "F32"]
        if qtype.name == "Q8_0" and array.shape[-1] % gguf.GGML_QUANT_SIZES[qtype][0]:
            qtype = gguf.GGMLQuantizationType.F16
        encoded[gguf_tensor_name(hf_name)] = (gguf.quants.quantize(array, qtype), qtype)
    path = pathlib.Path(path)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    writer = gguf.GGUFWriter(temporary, ARCHITECTURE)
    try:
        _add_metadata(writer, gguf, config, vocab, chat_template, name or path.stem, file_type)
        for gguf_name, (data, qtype) in encoded.items():
            writer.add_tensor(gguf_name, data, raw_dtype=qtype)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(temporary, path)
    except BaseException:
        writer.close()
        temporary.unlink(missing_ok=True)
        raise
    return path


# GGUFVocab.metadata()'s keys -> the GGUFWriter method that writes each.
_VOCAB_WRITERS = {
    "tokenizer.ggml.model": "add_tokenizer_model",
    "tokenizer.ggml.pre": "add_tokenizer_pre",
    "tokenizer.ggml.tokens": "add_token_list",
    "tokenizer.ggml.token_type": "add_token_types",
    "tokenizer.ggml.merges": "add_token_merges",
    "tokenizer.ggml.bos_token_id": "add_bos_token_id",
    "tokenizer.ggml.eos_token_id": "add_eos_token_id",
    "tokenizer.ggml.unknown_token_id": "add_unk_token_id",
    "tokenizer.ggml.padding_token_id": "add_pad_token_id",
    "tokenizer.ggml.add_bos_token": "add_add_bos_token",
    "tokenizer.ggml.add_eos_token": "add_add_eos_token",
}


def _add_metadata(writer, gguf, config, vocab, chat_template, name, file_type) -> None:
    """The keys llama.cpp reads for a 'llama' model, as its converter writes them."""
    writer.add_type(gguf.GGUFType.MODEL)
    writer.add_name(name)
    writer.add_context_length(config.max_len)
    writer.add_embedding_length(config.d_model)
    writer.add_block_count(config.decoder_layers)
    writer.add_feed_forward_length(config.d_ff)
    writer.add_head_count(config.num_heads)
    writer.add_head_count_kv(config.kv_heads)
    writer.add_rope_freq_base(config.rope_base)
    writer.add_layer_norm_rms_eps(config.layer_norm_eps)
    writer.add_rope_dimension_count(config.head_dim)
    writer.add_key_length(config.head_dim)
    writer.add_value_length(config.head_dim)
    writer.add_vocab_size(config.vocab_size)
    writer.add_file_type(gguf.LlamaFileType[file_type])
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    for key, value in vocab.metadata().items():
        getattr(writer, _VOCAB_WRITERS[key])(value)
    if chat_template is not None:
        writer.add_chat_template(chat_template)
