"""One command scales (issue 41, item 5): a text language model given no store_dir reads a
token store under its work directory, so its memory is flat in corpus size; in memory only
where it asks, where its batches need whole examples, or where it resumes a run that began
in memory."""

import json
import logging

import pytest
from train_helpers import tiny_config, write_tiny_text

from train.core.rundir import RunDir
from train.data.store.token_store import MANIFEST
from train.program import loop as train_lib


class _Stop(Exception):
    pass


def _config(tmp_path, **overrides):
    fields = dict(
        task="lm",
        corpus="text",
        packing="stream",
        bucket_lengths=(),
        batch_size=8,
        num_train_steps=4,
        checkpoint_every_steps=2,
        sample_prompts=(),
        prepare_workers=1,
    )
    return tiny_config(write_tiny_text(tmp_path), **{**fields, **overrides})


def _fingerprint(workdir) -> dict:
    return json.loads(RunDir(workdir).data_fingerprint.read_text())


def test_a_text_language_model_reads_a_store_in_its_work_directory(tmp_path):
    run = RunDir(tmp_path / "run")
    results = train_lib.train_and_evaluate(_config(tmp_path), str(run.path))
    assert (run.token_store / MANIFEST).is_file()
    assert "store_train_tokens" in _fingerprint(run.path)
    assert results["step"] == 4 and "bits_per_char" in results["valid"]
    # The config still names no store: a rerun (or another machine) derives the same one.
    assert json.loads(run.config.read_text())["store_dir"] == ""


def test_text_in_memory_reads_the_corpus_as_before(tmp_path):
    run = RunDir(tmp_path / "run")
    train_lib.train_and_evaluate(
        _config(tmp_path, **{"corpora.text.in_memory": True}), str(run.path)
    )
    assert not run.token_store.exists()
    assert set(_fingerprint(run.path)) == {"train", "valid", "sha256"}


def test_a_run_begun_in_memory_resumes_in_memory(tmp_path, caplog):
    run = RunDir(tmp_path / "run")

    def stop(step):
        if step == 2:
            raise _Stop

    with pytest.raises(_Stop):
        train_lib.train_and_evaluate(
            _config(tmp_path, **{"corpora.text.in_memory": True}), str(run.path), step_callback=stop
        )
    begun = _fingerprint(run.path)
    steps = []
    with caplog.at_level(logging.INFO):
        train_lib.train_and_evaluate(_config(tmp_path), str(run.path), step_callback=steps.append)
    assert steps == [3, 4]
    assert "it still does" in caplog.text
    assert not run.token_store.exists() and _fingerprint(run.path) == begun


def test_whole_example_batches_read_in_memory_with_a_warning(tmp_path, caplog):
    run = RunDir(tmp_path / "run")
    config = _config(tmp_path, packing="none", max_len=32, bucket_lengths=(32,))
    with caplog.at_level(logging.WARNING):
        train_lib.train_and_evaluate(config, str(run.path))
    assert not run.token_store.exists()
    assert "--config.packing='none' reads the text corpus in memory" in caplog.text


def test_segments_sized_by_tokens_per_batch_become_windows_of_as_many_tokens(tmp_path, caplog):
    run = RunDir(tmp_path / "run")
    config = _config(tmp_path, packing="segments", batch_size=0, tokens_per_batch=64)
    with caplog.at_level(logging.INFO):
        results = train_lib.train_and_evaluate(config, str(run.path))
    assert (run.token_store / MANIFEST).is_file() and results["step"] == 4
    assert "Token store windows: 4 rows of --config.max_len=16 tokens" in caplog.text
