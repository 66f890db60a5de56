"""Pretrained sources as registered kinds (`train.formats.sources.KINDS`): a new kind is one
module and its entry in the table, nothing else (docs/training.md's "Add a pretrained-source
format" example is read from the page, registered, and fine-tuned from), and a path no kind
accepts is refused with the messages of before the table."""

import dataclasses
import json
import pathlib
import re
import types

import jax
import numpy as np
import pytest
from flax import linen as nn
from flax import traverse_util

pytest.importorskip("tokenizers")

from configs import finetune_gpt2  # noqa: E402
from flax_transformer import DecoderOnlyTransformer, TransformerConfig  # noqa: E402
from train.config import config_lib  # noqa: E402
from train.data.tokenizers import source_tokenizer  # noqa: E402
from train.formats import sources  # noqa: E402
from train.formats.corpora.bibles import load_kjv_lines  # noqa: E402
from train.program import loop as train_lib  # noqa: E402
from train.program import weights  # noqa: E402
from train.program.trained import load_trained  # noqa: E402
from train.tiny_pretrained import train_tokenizer  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "training.md"
# GPT-2's marker of start and end, the special token `train_tokenizer` gives the 'gpt2' family.
END = "<|endoftext|>"
# The toy model's architecture: what its config.json holds.
ARCHITECTURE = dict(
    d_model=32,
    num_heads=2,
    d_ff=64,
    num_layers=2,
    max_len=64,
    norm="rmsnorm",
    positional="rope",
    activation="swiglu",
)


def _example_module() -> types.ModuleType:
    """docs/training.md's "Add a pretrained-source format" module, read from the page."""
    text = PAGE.read_text(encoding="utf-8")
    (code,) = re.findall(r"```python\n(# train/formats/sources/npz_params.py\n.*?)```", text, re.S)
    module = types.ModuleType("npz_params")
    exec(compile(code, str(PAGE), "exec"), module.__dict__)
    return module


@pytest.fixture(scope="module")
def texts():
    return load_kjv_lines()[:600]


@pytest.fixture(scope="module")
def toy(tmp_path_factory, texts):
    """A directory of the docs' kind: config.json, model.npz and a byte-level BPE
    tokenizer; returns (the directory, its model config, its parameters flattened)."""
    directory = tmp_path_factory.mktemp("npz")
    tokenizer = train_tokenizer(texts, 300, "gpt2")
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": END, "eos_token": END})
    )
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    fields = {**ARCHITECTURE, "vocab_size": size + 1, "pad_id": size}  # an added pad id
    (directory / "config.json").write_text(json.dumps({"flax_transformer": fields}))
    config = TransformerConfig(**fields)
    variables = DecoderOnlyTransformer(config).init(jax.random.key(3), np.zeros((1, 4), np.int32))
    flat = traverse_util.flatten_dict(nn.unbox(variables)["params"])
    arrays = {"/".join(path): np.asarray(value) for path, value in flat.items()}
    np.savez(directory / "model.npz", **arrays)
    return directory, config, flat


@pytest.fixture
def registered(monkeypatch):
    """The docs' module, its KIND in the table (its registration line, done by hand)."""
    module = _example_module()
    # The line the page shows is the table's line with the new entry.
    table = (ROOT / "train" / "formats" / "sources" / "__init__.py").read_text(encoding="utf-8")
    (line,) = re.findall(r"^KINDS = \((.*)\)$", table, re.M)
    assert f"`KINDS = ({line}, npz_params.KIND)`" in PAGE.read_text(encoding="utf-8")
    monkeypatch.setattr(sources, "KINDS", (*sources.KINDS, module.KIND))
    monkeypatch.setattr(sources, "_OPENED", {})
    return module


def test_the_docs_kind_gives_model_config_weights_and_tokenizer(registered, toy, texts):
    directory, config, flat = toy
    source = sources.read_source(directory)
    assert isinstance(source, registered.NpzSource) and isinstance(source, sources.Source)
    assert source.model == config and not source.trained_here
    params, size = weights.load_weights(source, source.model)
    assert size == (directory / "model.npz").stat().st_size
    loaded = traverse_util.flatten_dict(params)
    assert loaded.keys() == flat.keys()
    for path, value in flat.items():
        np.testing.assert_array_equal(np.asarray(loaded[path]), np.asarray(value))
    tokenizer = source_tokenizer(source)
    assert tokenizer.decode(tokenizer.encode(texts[5])) == texts[5]
    assert tokenizer.pad_id == config.pad_id
    # Its snapshot (config and tokenizer, no weights) is read as the same kind.
    sources.snapshot(source, directory.parent / "copy")
    copy = sources.read_source(directory.parent / "copy", need_weights=False)
    assert isinstance(copy, registered.NpzSource) and copy.model == config
    assert copy.tokenizer_sha256() == source.tokenizer_sha256()


def test_the_docs_kind_refuses_in_one_line(registered, toy, tmp_path):
    directory, _, _ = toy
    empty = tmp_path / "no-weights"
    empty.mkdir()
    (empty / "config.json").write_text(json.dumps({"flax_transformer": {"d_modle": 32}}))
    with pytest.raises(ValueError, match=r"^--config.init_from='.*no-weights': no model.npz\.$"):
        sources.read_source(empty)
    with pytest.raises(ValueError, match="holds no TransformerConfig.*d_modle"):
        sources.read_source(empty, need_weights=False)


def test_a_run_fine_tunes_from_the_docs_kind(registered, toy, texts, tmp_path):
    """The whole run from the new kind: its model config merged with the run's choices, its
    tokenizer, its weights placed (at learning rate 0 the trained parameters are its own)."""
    directory, config, flat = toy
    corpus = tmp_path / "kjv.txt"
    corpus.write_text("\n".join(texts) + "\n", encoding="utf-8")
    run_config = finetune_gpt2.get_config()
    run_config.update(
        init_from=str(directory),
        corpus="text",
        corpus_path=str(corpus),
        max_len=32,
        batch_size=4,
        valid_fraction=0.1,
        test_fraction=0.0,
        num_train_steps=1,
        learning_rate=0.0,
        warmup_steps=0,
        schedule="constant",
        eval_every_steps=1000,
        checkpoint_every_steps=1000,
        num_eval_batches=1,
        async_checkpoints=False,
        sample_prompts=(),
        max_decode_len=8,
    )
    experiment = config_lib.validate_config(run_config)
    fields = dataclasses.asdict(experiment.model)
    assert {k: fields[k] for k in ARCHITECTURE} == ARCHITECTURE
    assert experiment.model.vocab_size == config.vocab_size
    results = train_lib.train_and_evaluate(run_config, str(tmp_path / "run"))
    assert np.isfinite(results["valid"]["loss"])
    trained = traverse_util.flatten_dict(load_trained(str(tmp_path / "run")).params)
    for path, value in flat.items():
        np.testing.assert_allclose(np.asarray(trained[path]), np.asarray(value), rtol=0, atol=0)
    record = json.loads((tmp_path / "run" / "pretrained" / sources.SOURCE_FILE).read_text())
    assert record["family"] == registered.NpzSource.family


def test_a_path_no_kind_accepts_keeps_its_message(tmp_path):
    def refusal(path) -> str:
        with pytest.raises(ValueError) as err:
            sources.read_source(path)
        return str(err.value)

    assert "no such directory or .gguf file" in refusal(tmp_path / "nothing")
    (tmp_path / "file.txt").write_text("x")
    assert "not a directory or .gguf file" in refusal(tmp_path / "file.txt")
    assert refusal(tmp_path) == (
        f"--config.init_from={str(tmp_path)!r}: no config.json: not a save_pretrained directory."
    )
    (tmp_path / "config.json").write_text("{not json")
    assert "config.json is not readable JSON" in refusal(tmp_path)
    (tmp_path / "config.json").write_text('{"d_model": 32}')
    assert refusal(tmp_path).endswith(
        "config.json has no model_type: neither a Hugging Face model nor a train.main run."
    )
    # Each built-in kind detects its own paths only.
    assert [kind.name for kind in sources.KINDS] == [
        "GGUF file",
        "train.main run",
        "Hugging Face directory",
    ]
    assert not any(kind.detect(tmp_path) for kind in sources.KINDS)
