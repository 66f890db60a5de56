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
from flax_transformer.interop.gguf_layout import (  # noqa: E402
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


# The program: `python -m train.export --format gguf`.


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory, vocab_parts):
    """A run fine-tuned with LoRA (q and v, 2 steps) from a tiny quantized GGUF file."""
    from configs import finetune_gpt2
    from train.program import loop as train_lib

    root = tmp_path_factory.mktemp("run")
    written = gguf_files.write_tiny_gguf(root, *vocab_parts, hf_dir=False)
    corpus = root / "kjv.txt"
    corpus.write_text("\n".join(load_kjv_lines(collapse=False)[3000:3400]) + "\n")
    config = finetune_gpt2.get_config()
    config.update(
        init_from=str(written.path),
        corpus="text",
        corpus_path=str(corpus),
        max_len=32,
        batch_size=4,
        num_train_steps=2,
        learning_rate=1e-2,
        warmup_steps=0,
        schedule="constant",
        eval_every_steps=1000,
        num_eval_batches=1,
        async_checkpoints=False,
        max_decode_len=4,
    )
    config.model.dropout_rate = 0.0
    config.model.lora_rank = 2
    config.model.lora_targets = ("q", "v")
    train_lib.train_and_evaluate(config, str(root / "run"))
    return root / "run", written


def test_a_lora_run_exports_merged_with_the_files_vocabulary(lora_run, tmp_path):
    from train.export import write_trained_gguf
    from train.program.trained import load_trained

    workdir, written = lora_run
    trained = load_trained(workdir)
    out = write_trained_gguf(trained, workdir, tmp_path / "run.gguf", "f32")
    config, variables, vocab, template = read_gguf(out)
    source_vocab = read_gguf(written.path)[2]
    assert vocab == source_vocab and template == gguf_files.CHAT_TEMPLATE
    assert config.vocab_size == trained.model.config.vocab_size - 1  # the added pad id gone
    ids = np.random.default_rng(2).integers(0, config.vocab_size, (2, 16))
    ids[np.isin(ids, [config.pad_id, trained.model.config.pad_id])] = 5
    ours = np.asarray(trained.model.apply({"params": trained.params}, ids))[
        ..., : config.vocab_size
    ]
    # The adapters moved the model: the export holds the merged weights, not the file's.
    base = read_gguf(written.path)
    assert not np.allclose(ours, DecoderOnlyTransformer(base[0]).apply(base[1], ids), atol=1e-3)
    exported = np.asarray(DecoderOnlyTransformer(config).apply(variables, ids))
    np.testing.assert_allclose(exported, ours, rtol=0, atol=RELATIVE * np.abs(ours).max())


def test_the_export_command_writes_q8_0_and_refuses_misuse(lora_run, tmp_path):
    import subprocess
    import sys

    workdir, _ = lora_run
    out = tmp_path / "run-q8_0.gguf"
    command = [sys.executable, "-m", "train.export", f"--workdir={workdir}", f"--out={out}"]
    done = subprocess.run(
        [*command, "--format=gguf", "--type=q8_0"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"Wrote {out} (q8_0" in done.stdout
    reader = gguf.GGUFReader(out)
    assert reader.fields["general.file_type"].contents() == gguf.LlamaFileType.MOSTLY_Q8_0
    assert {t.tensor_type.name for t in reader.tensors} == {"Q8_0", "F32"}
    refused = subprocess.run([*command, "--type=q8_0"], capture_output=True, text=True)
    assert refused.returncode == 2 and "--type applies to --format gguf" in refused.stderr


def test_runs_without_a_llama_cpp_tokenizer_are_refused(tmp_path):
    import json

    from train.export import gguf_vocab

    with pytest.raises(ValueError, match="was trained from scratch"):
        gguf_vocab(tmp_path)
    copy = tmp_path / "pretrained"
    copy.mkdir()
    gpt2 = {"model_type": "gpt2", "vocab_size": 10, "n_positions": 8, "n_embd": 4}
    (copy / "config.json").write_text(json.dumps(gpt2 | {"n_layer": 1, "n_head": 1}))
    with pytest.raises(ValueError, match="started from a gpt2 model"):
        gguf_vocab(tmp_path)
