"""Training from a token store: train.main prepares a missing store, and a run resumed from a
checkpoint, on the same or another number of processes and devices, ends where the
uninterrupted run ends (the batch of step k is a function of store, seed and k alone)."""

import json
import pathlib
import shutil

import jax
import numpy as np
import pytest
from test_multiprocess import _params, _run
from train_helpers import tiny_config, write_tiny_text

from train.core.rundir import RunDir
from train.data.store.token_store import MANIFEST
from train.program import loop as train_lib
from train.program import metrics

STEPS, CHECKPOINT_EVERY = 8, 4


def _config(corpus: pathlib.Path, store: pathlib.Path, **overrides):
    fields = dict(
        task="lm",
        corpus="text",
        packing="segments",
        max_len=16,
        batch_size=8,
        num_train_steps=STEPS,
        checkpoint_every_steps=CHECKPOINT_EVERY,
        keep_checkpoints=3,
        store_dir=str(store),
        prepare_workers=1,
        sample_prompts=(),
    )
    config = tiny_config(corpus, **{**fields, **overrides})
    config.bucket_lengths = ()
    config.model.attention_bias = False  # see test_multiprocess._config_file
    return config


def _valid_losses(workdir: pathlib.Path) -> list[tuple]:
    return [
        (r["step"], r["nll"])
        for r in metrics.read_metrics(RunDir(workdir).metrics)
        if r["split"] == "valid"
    ]


def test_train_main_prepares_a_missing_store_and_trains_from_it(tmp_path):
    corpus = write_tiny_text(tmp_path, num_lines=400)
    config = _config(corpus, tmp_path / "store", num_train_steps=4)
    results = train_lib.train_and_evaluate(config, str(tmp_path / "run"))
    assert (tmp_path / "store" / MANIFEST).is_file()
    assert results["step"] == 4 and np.isfinite(results["valid"]["nll"])
    assert "bits_per_char" in results["valid"]
    # Rerunning finds the finished run; a fresh run reads the store as it is.
    again = train_lib.train_and_evaluate(config, str(tmp_path / "again"))
    assert again["valid"]["nll"] == results["valid"]["nll"]


@pytest.mark.slow
def test_a_resumed_run_ends_where_the_uninterrupted_one_ends(tmp_path):
    corpus = write_tiny_text(tmp_path, num_lines=400)
    config = _config(corpus, tmp_path / "store")
    whole = train_lib.train_and_evaluate(config, str(tmp_path / "whole"))

    def stop(step):
        if step == CHECKPOINT_EVERY + 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train_lib.train_and_evaluate(config, str(tmp_path / "cut"), step_callback=stop)
    resumed = train_lib.train_and_evaluate(config, str(tmp_path / "cut"))
    assert resumed["valid"] == whole["valid"]
    jax.tree.map(
        np.testing.assert_array_equal,
        _params(tmp_path / "cut", STEPS),
        _params(tmp_path / "whole", STEPS),
    )


def _config_file(directory: pathlib.Path, config) -> str:
    path = directory / "store_config.py"
    path.write_text(
        "import ml_collections\n\n\n"
        f"def get_config():\n    return ml_collections.ConfigDict({config.to_dict()!r})\n"
    )
    return str(path)


def _resume_copy(source: pathlib.Path, target: pathlib.Path) -> None:
    """The run directory as it was after checkpoint CHECKPOINT_EVERY (later ones removed)."""
    shutil.copytree(source, target)
    for checkpoint in RunDir(target).checkpoints.iterdir():
        if checkpoint.name.isdigit() and int(checkpoint.name) > CHECKPOINT_EVERY:
            shutil.rmtree(checkpoint)
    (target / "results.json").unlink()


@pytest.mark.slow
def test_a_run_resumes_exactly_on_another_number_of_processes_and_devices(tmp_path):
    corpus = write_tiny_text(tmp_path, num_lines=400)
    config = _config_file(tmp_path, _config(corpus, tmp_path / "store"))

    def args(workdir):
        return ["--config", config, "--workdir", str(workdir)]

    reference = tmp_path / "1x4"
    assert _run(1, 4, args(reference)) == 0  # prepares the store, then trains
    for processes, devices in ((1, 8), (2, 4)):
        workdir = tmp_path / f"{processes}x{devices}"
        _resume_copy(reference, workdir)
        assert _run(processes, devices, args(workdir)) == 0
        jax.tree.map(
            lambda a, b: np.testing.assert_allclose(a, b, rtol=0, atol=1e-6),
            _params(workdir, STEPS),
            _params(reference, STEPS),
        )
        got, want = _valid_losses(workdir), _valid_losses(reference)
        assert [step for step, _ in got] == [step for step, _ in want]
        np.testing.assert_allclose([x for _, x in got], [x for _, x in want], atol=1e-6)
        saved = json.loads((workdir / "results.json").read_text())
        assert saved["step"] == STEPS
