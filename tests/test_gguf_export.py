"""GGUF read and written by the library (`flax_transformer.interop.gguf`), offline: tiny
Llama files (tests/gguf_files.py: random weights, a byte-level BPE trained on the King James
Bible) read, written in each type and read back; a model written by us read by transformers'
GGUF loader; what llama.cpp cannot run refused before anything is written."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

gguf = pytest.importorskip("gguf")
pytest.importorskip("tokenizers")

import gguf_files  # noqa: E402

from flax_transformer import (  # noqa: E402
    DecoderOnlyTransformer,
    GGUFVocab,
    Transformer,
    read_gguf,
    write_gguf,
)
from flax_transformer.interop.gguf import (  # noqa: E402
    from_llama_cpp_rows,
    to_llama_cpp_rows,
)
from flax_transformer.interop.llama import llama_tensors  # noqa: E402
from train.formats.corpora.bibles import load_kjv_lines  # noqa: E402

# transformers' GGUF loader against ours in float32: the two sum the same products in other
# orders, so they agree to float32 rounding relative to the largest logit (1e-5 of it: ~80
# ulps after two layers; tests/test_gguf.py's absolute 1e-5 is this at logits near 1).
RELATIVE = 1e-5
# Random weights drawn at our init scale (0.02) give logits of a few thousandths; scaled up,
# the logits span several units and a wrong row order shows.
WEIGHT_SCALE = 25.0
Q8_0_BLOCK = 32


@pytest.fixture(scope="module")
def vocab_parts():
    """A 400-token byte-level BPE: (tokens, merges)."""
    return gguf_files.train_bpe(load_kjv_lines(collapse=False)[:3000], 400)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, vocab_parts):
    """read_gguf of a tiny float32 Llama file (untied head, 4 query and 2 key/value heads)."""
    root = tmp_path_factory.mktemp("tiny")
    written = gguf_files.write_tiny_gguf(root, *vocab_parts, matrix_type="F32", hf_dir=False)
    return read_gguf(written.path), written


def _tensors(config, variables) -> dict[str, np.ndarray]:
    return llama_tensors(config, variables)


def test_read_gives_the_files_vocabulary_and_weights(tiny):
    (config, variables, vocab, template), written = tiny
    assert config.vocab_size == len(vocab) == written.hf_config["vocab_size"]  # no added id
    assert config.pad_id == vocab.pad_id  # the file's padding id, a real token
    assert template == gguf_files.CHAT_TEMPLATE
    assert vocab.pre == "smollm" and vocab.tokens[:3] == gguf_files.SPECIALS
    ours = _tensors(config, variables)
    assert set(ours) == set(written.tensors)
    for name, expected in written.tensors.items():
        np.testing.assert_array_equal(ours[name], expected, err_msg=name)


def test_llama_cpp_row_order_is_undone_by_its_inverse():
    weight = np.arange(4 * 8 * 3, dtype=np.float32).reshape(4 * 8, 3)
    moved = to_llama_cpp_rows(weight, 4)
    # Head 0's rows 0..3 (first half) and 4..7 (second half) go to 0, 2, 4, 6 and 1, 3, 5, 7.
    np.testing.assert_array_equal(moved[:8, 0], weight[[0, 4, 1, 5, 2, 6, 3, 7], 0])
    np.testing.assert_array_equal(from_llama_cpp_rows(moved, 4), weight)


@pytest.mark.parametrize("kind", ["f32", "f16", "bf16"])
def test_read_write_read_is_bitwise_for_float_types(tiny, tmp_path, kind):
    (config, variables, vocab, template), _ = tiny
    first = write_gguf(tmp_path / "a.gguf", config, variables, vocab, template, type=kind, name="m")
    config_a, variables_a, vocab_a, template_a = read_gguf(first)
    second = write_gguf(
        tmp_path / "b.gguf", config_a, variables_a, vocab_a, template_a, type=kind, name="m"
    )
    read_b = read_gguf(second)
    assert first.read_bytes() == second.read_bytes()
    assert (read_b[0], read_b[2], read_b[3]) == (config, vocab, template)
    dtype = {"f32": np.float32, "f16": np.float16, "bf16": jnp.bfloat16}[kind]
    original, once, twice = (
        _tensors(c, v) for c, v in ((config, variables), (config_a, variables_a), read_b[:2])
    )
    for name, value in original.items():
        np.testing.assert_array_equal(twice[name], once[name], err_msg=name)
        # Matrices rounded to the type once (to nearest, as numpy / ml_dtypes cast), norms kept.
        expected = value.astype(dtype).astype(np.float32) if value.ndim == 2 else value
        np.testing.assert_array_equal(once[name], expected, err_msg=name)


def test_q8_0_is_gguf_quants_own_round_trip(tiny, tmp_path):
    (config, variables, vocab, template), _ = tiny
    path = write_gguf(tmp_path / "q.gguf", config, variables, vocab, template, type="q8_0")
    config_q, variables_q, _, _ = read_gguf(path)
    original, read = _tensors(config, variables), _tensors(config_q, variables_q)
    heads = {"q_proj": config.num_heads, "k_proj": config.kv_heads}
    q8 = gguf.GGMLQuantizationType.Q8_0
    for name, value in original.items():
        if value.ndim == 1:
            np.testing.assert_array_equal(read[name], value, err_msg=name)
            continue
        kind = name.rsplit(".", 2)[-2]
        stored = to_llama_cpp_rows(value, heads[kind]) if kind in heads else value
        back = gguf.quants.dequantize(gguf.quants.quantize(stored, q8), q8)
        back = from_llama_cpp_rows(back, heads[kind]) if kind in heads else back
        np.testing.assert_array_equal(read[name], back, err_msg=name)
        # Within one quantization step of each 32-value block (amax / 127).
        blocks = np.abs(value.reshape(-1, Q8_0_BLOCK)).max(1, keepdims=True)
        error = np.abs(read[name] - value).reshape(-1, Q8_0_BLOCK)
        assert (error <= blocks / 127).all(), name


def test_vocab_round_trips_through_a_hugging_face_tokenizer(tiny):
    (_, _, vocab, _), _ = tiny
    tokenizer = vocab.tokenizer()
    roles = vocab.special_tokens()
    again = GGUFVocab.from_tokenizer(tokenizer.to_str(), **roles)
    assert again == vocab
    framed = dataclasses.replace(vocab, add_bos=True)
    assert GGUFVocab.from_tokenizer(framed.tokenizer(), **roles).add_bos


@pytest.fixture(scope="module")
def transformers():
    pytest.importorskip("torch")
    return pytest.importorskip("transformers")


@pytest.mark.parametrize("tie, kv_heads", [(True, 2), (False, 4)])
def test_a_model_we_write_reads_in_transformers_with_our_logits(
    tiny, transformers, tmp_path, tie, kv_heads
):
    import torch

    (config, _, vocab, template), _ = tiny
    config = dataclasses.replace(config, tie_output_embedding=tie, num_kv_heads=kv_heads)
    model = DecoderOnlyTransformer(config)
    params = nn.unbox(model.init(jax.random.key(3), jnp.ones((1, 4), jnp.int32)))["params"]
    params = jax.tree.map(lambda x: x * WEIGHT_SCALE if x.ndim > 1 else x, params)
    path = write_gguf(
        tmp_path / "ours.gguf", config, {"params": params}, vocab, template, type="f32"
    )
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        str(tmp_path), gguf_file=path.name, dtype=torch.float32
    ).eval()
    ids = np.random.default_rng(1).integers(0, config.vocab_size, (2, 24))
    ids[ids == config.pad_id] = config.pad_id + 1  # our model masks pad keys, theirs does not
    with torch.no_grad():
        theirs = hf(torch.as_tensor(ids)).logits.numpy()
    ours = np.asarray(model.apply({"params": params}, jnp.asarray(ids)))
    assert np.abs(ours).max() > 1.0  # logits large enough for the comparison to mean something
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=RELATIVE * np.abs(theirs).max())
    np.testing.assert_array_equal(ours.argmax(-1), theirs.argmax(-1))


# Refusals: one ValueError line naming the reason, nothing written.


def _llama_variables(config):
    return DecoderOnlyTransformer(config).init(jax.random.key(0), jnp.ones((1, 4), jnp.int32))


@pytest.mark.parametrize(
    "changes, named",
    [
        (dict(norm="layernorm"), "norm='layernorm' (needs 'rmsnorm')"),  # GPT-2's layout
        (dict(positional="learned"), "positional='learned' (needs 'rope')"),
        (dict(qk_norm=True), "qk_norm=True (needs False)"),
        (dict(lora_rank=2, lora_targets=("q",)), "lora_rank=2 has LoRA adapters"),
        (dict(activation="geglu"), "runs SwiGLU (SiLU-gated) feed-forwards only"),
        (dict(vocab_size=401), "vocab_size=401 but the vocabulary 400 tokens"),
    ],
)
def test_what_llama_cpp_cannot_run_is_refused_before_writing(tiny, tmp_path, changes, named):
    (config, _, vocab, template), _ = tiny
    config = dataclasses.replace(config, **changes)
    path = tmp_path / "out.gguf"
    path.write_bytes(b"an older file")
    with pytest.raises(ValueError, match="^write_gguf") as err:
        write_gguf(path, config, _llama_variables(config), vocab, template)
    assert named in str(err.value) and "\n" not in str(err.value)
    assert path.read_bytes() == b"an older file" and len(list(tmp_path.iterdir())) == 1


def test_an_encoder_decoder_an_unknown_type_and_a_plain_tokenizer_are_refused(tiny, tmp_path):
    (config, variables, vocab, template), _ = tiny
    seq2seq = Transformer(config).init(
        jax.random.key(0), jnp.ones((1, 4), jnp.int32), jnp.ones((1, 4), jnp.int32)
    )
    with pytest.raises(ValueError, match="needs DecoderOnlyTransformer parameters"):
        write_gguf(tmp_path / "a.gguf", config, seq2seq, vocab)
    with pytest.raises(ValueError, match="type='q4_k'; choose one of"):
        write_gguf(tmp_path / "a.gguf", config, variables, vocab, type="q4_k")
    with pytest.raises(ValueError, match="pass a GGUFVocab"):
        write_gguf(tmp_path / "a.gguf", config, variables, vocab.tokenizer())
    assert not list(tmp_path.iterdir())
    from tokenizers import Tokenizer, models, normalizers

    with pytest.raises(ValueError, match="WordLevel model .* has no llama.cpp vocabulary kind"):
        GGUFVocab.from_tokenizer(Tokenizer(models.WordLevel({"a": 0}, unk_token="a")))
    normalized = vocab.tokenizer()
    normalized.normalizer = normalizers.NFKC()
    with pytest.raises(ValueError, match="has a normalizer \\(NFKC\\)"):
        GGUFVocab.from_tokenizer(normalized)


def test_read_refuses_another_architecture_naming_the_file(vocab_parts, tmp_path):
    written = gguf_files.write_tiny_gguf(tmp_path, *vocab_parts, hf_dir=False, architecture="qwen2")
    with pytest.raises(ValueError, match=f"^{written.path}: architecture 'qwen2' is not supported"):
        read_gguf(written.path)
