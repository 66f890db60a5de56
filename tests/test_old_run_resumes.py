"""A run directory written by an earlier version of the program still resumes.

`tests/data/old_runs/<kind>/` are run directories that the code of commit 2914836 wrote
(before the data path was rewritten): `write_run(kind, directory, kill_at=6)` below, run in
a checkout of that commit, trained 6 of 8 steps and died after the checkpoint of step 4.
They are kept as written but for orbax's `commit_success.txt` markers, which name the
directory they were written in and which a restore from a local disk does not read.

Resuming one must pass the identity and data checks, restore the checkpoint and the
data-stream position, and end where a run of today's code that never stopped ends: so the
old code's batches of steps 1-4 are today's, and today's steps 5-8 (crossing into the next
epoch) continue the old stream where it stopped.
"""

import logging
import os
import pathlib
import shutil

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from train_helpers import tiny_config, write_tiny_text, write_tiny_tsv

from train.core.rundir import RunDir
from train.program import checkpoint, metrics
from train.program import loop as train_lib

OLD_RUNS = pathlib.Path(__file__).parent / "data" / "old_runs"
# Each kind of old run and the corpus it read (relative to its current directory).
CORPUS_WRITERS = {"translation-segments": write_tiny_tsv, "lm-stream": write_tiny_text}
NUM_STEPS = 8
# The old runs' states come from older code, and maybe another machine's XLA build, whose
# float sums can be ordered differently: each leaf is compared within 1e-5 of its own
# largest magnitude (rounding moves an Adam moment near zero across zero, so a fixed atol
# would measure noise). A batch other than the old one moves every parameter by about the
# learning rate (3e-3) in one Adam step, and the moments by the size of the gradient:
# orders of magnitude more than this. The key biases are left out: adding one vector to
# every key adds the same number to all of a query's logits, which softmax ignores, so
# their gradient is zero in exact arithmetic and what they receive is rounding, which Adam
# scales up to steps of its own (seen: 2.9e-7 apart after 8 steps, 2.4e-5 of the leaf).
ACROSS_CODE = 1e-5

pytestmark = pytest.mark.filterwarnings(
    "ignore:Exception ignored in. None:pytest.PytestUnraisableExceptionWarning"
)


class _Killed(Exception):
    pass


def _config(kind: str, **extra):
    """The old runs' config (`extra`: fields today's code added). The corpus path is relative
    (the run's current directory), so config.json, which must match on resume, names the same
    file wherever the test runs."""
    tiny = dict(
        **extra,
        **{"optimizer.name": "adam"},  # the old default, their checkpoints' optimizer state
        num_train_steps=NUM_STEPS,
        bleu_examples=0,
        batch_size=48,  # an epoch of a few batches: steps 5-8 cross into the next one
        **{"model.d_model": 8, "model.d_ff": 16, "model.num_heads": 2},
    )
    if kind == "translation-segments":
        return tiny_config(
            pathlib.Path("pairs.tsv"), packing="segments", copied_targets=0.5, **tiny
        )
    return tiny_config(
        pathlib.Path("lines.txt"),
        task="lm",
        corpus="text",
        packing="stream",
        sample_prompts=("In",),  # the default prompt has no room for new tokens in max_len
        **tiny,
    )


def write_run(
    kind: str, directory: pathlib.Path, kill_at: int | None = None, **extra
) -> pathlib.Path:
    """Writes the corpus into `directory` and trains `kind` in `directory/run` from there,
    stopping after step `kill_at` (None: to the end); `extra`: config fields as `_config`."""
    directory.mkdir(parents=True, exist_ok=True)
    CORPUS_WRITERS[kind](directory)

    def die(step):
        if step == kill_at:
            raise _Killed(step)

    cwd = os.getcwd()
    os.chdir(directory)
    try:
        train_lib.train_and_evaluate(_config(kind, **extra), "run", step_callback=die)
    except _Killed:
        pass
    finally:
        os.chdir(cwd)
    return directory / "run"


def _saved(workdir: pathlib.Path, step: int) -> tuple:
    """(train state as numpy arrays, progress dict) of checkpoint `step`."""
    with ocp.StandardCheckpointer() as raw:
        state = raw.restore(RunDir(workdir).checkpoints / str(step) / "state")
    checkpointer = checkpoint.Checkpointer(workdir, read_only=True)
    try:
        return checkpointer.restore(state, step)
    finally:
        checkpointer.close()


# Where the key bias sits in the fused projections' biases: (q, k, v) and (k, v) first.
KEY_BIAS_INDEX = {"qkv_bias": 1, "kv_bias": 0}


def _without_key_bias(path, leaf: np.ndarray) -> np.ndarray:
    """`leaf` (a parameter or its Adam moment) without the rows of a key bias."""
    name = getattr(path[-1], "key", None)
    if name in KEY_BIAS_INDEX:
        return np.delete(leaf, KEY_BIAS_INDEX[name], axis=0)
    return leaf


def _assert_states_close(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for (path, x), y in zip(
        jax.tree_util.tree_leaves_with_path(a), jax.tree.leaves(b), strict=True
    ):
        x, y = (_without_key_bias(path, np.asarray(leaf)) for leaf in (x, y))
        scale = float(np.abs(y).max()) if y.size and np.issubdtype(y.dtype, np.floating) else 0.0
        np.testing.assert_allclose(x, y, rtol=ACROSS_CODE, atol=ACROSS_CODE * scale)


@pytest.mark.slow  # two short runs per kind: ~30 s each on 2 cores
@pytest.mark.parametrize("kind", CORPUS_WRITERS)
def test_an_old_run_directory_resumes_where_it_stopped(kind, tmp_path, monkeypatch, caplog):
    old = tmp_path / "old"
    old.mkdir()
    shutil.copytree(OLD_RUNS / kind, old / "run")
    CORPUS_WRITERS[kind](old)
    monkeypatch.chdir(old)
    steps = []
    with caplog.at_level(logging.INFO):
        train_lib.train_and_evaluate(_config(kind), "run", step_callback=steps.append)
    assert steps == [5, 6, 7, 8]  # resumed after the old checkpoint, not started over
    assert "Resumed from checkpoint step 4." in caplog.text

    # The old run's records up to its checkpoint kept, those of its lost steps 5-6 replaced.
    kept = [r for r in metrics.read_metrics(RunDir(OLD_RUNS / kind).metrics) if r["step"] <= 4]
    records = metrics.read_metrics(RunDir(old / "run").metrics)
    assert records[: len(kept)] == kept
    assert {r["step"] for r in records[len(kept) :]} == {6, 8}

    assert not RunDir(old / "run").token_store.exists()  # it read its corpus in memory
    # Today's code, never stopped, reading the corpus in memory too (a fresh text language
    # model reads a token store by default).
    straight = write_run(kind, tmp_path / "new", **{"corpora.text.in_memory": True})
    for step in (4, NUM_STEPS):
        (resumed_state, resumed_progress), (state, progress) = (
            _saved(run, step) for run in (old / "run", straight)
        )
        _assert_states_close(resumed_state, state)
        # The same data-stream position (the clock, wall_s, is the run's own).
        assert resumed_progress["stream"] == progress["stream"]
        assert resumed_progress["step"] == progress["step"]
