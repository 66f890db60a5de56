"""The training program with the speedrun's optimizers (issue 51): Muon resumes exactly,
schedule-free AdamW is evaluated, sampled and read back at its averaged point, and their
settings are checked. The rules themselves: tests/test_optim.py."""

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from train_helpers import tiny_config, write_tiny_tsv

from train.config import config_lib
from train.config.sections import OptimizerConfig, ScheduleConfig
from train.core.rundir import RunDir
from train.program import loop as train_lib
from train.program import metrics
from train.program.checkpoint import Checkpointer
from train.program.trained import load_trained
from train.tasks.common import inference

pytestmark = pytest.mark.filterwarnings(
    "ignore:Exception ignored in. None:pytest.PytestUnraisableExceptionWarning"
)


class _Killed(Exception):
    pass


def _kill_at(step_to_die):
    def callback(step):
        if step == step_to_die:
            raise _Killed(step)

    return callback


def _saved_state(workdir, step):
    with ocp.StandardCheckpointer() as checkpointer:
        return checkpointer.restore(RunDir(workdir).checkpoints / str(step) / "state")


@pytest.mark.slow  # three short runs
def test_muon_on_a_scanned_stack_resumes_bit_identically(tmp_path):
    """Muon's momentum (and its AdamW's moments) resume with the rest of the state: a run
    killed after checkpoint 4 ends bitwise where the uninterrupted one does."""
    config = tiny_config(
        write_tiny_tsv(tmp_path),
        bleu_examples=0,
        **{
            "optimizer.name": "muon",
            "optimizer.muon.learning_rate": 0.05,
            "model.scan_layers": True,
            "model.num_layers": 2,
        },
    )
    straight = tmp_path / "straight"
    results = train_lib.train_and_evaluate(config, str(straight))
    records = metrics.read_metrics(RunDir(straight).metrics)
    train = [r for r in records if r["split"] == "train"]
    assert train[-1]["loss"] < train[0]["loss"]
    assert np.isfinite(results["valid"]["nll"])

    interrupted = tmp_path / "interrupted"
    with pytest.raises(_Killed):
        train_lib.train_and_evaluate(config, str(interrupted), step_callback=_kill_at(6))
    train_lib.train_and_evaluate(config, str(interrupted))
    a, b = _saved_state(straight, 8), _saved_state(interrupted, 8)
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_schedule_free_evaluates_samples_and_reads_back_its_average(tmp_path):
    """The state's params are y (gradients are taken there); validation, the report's
    translations and `load_trained` (every tool) use x, the averaged point."""
    config = tiny_config(
        write_tiny_tsv(tmp_path),
        schedule="constant",
        learning_rate=1e-2,
        **{"optimizer.name": "schedule_free_adamw"},
    )
    workdir = tmp_path / "run"
    results = train_lib.train_and_evaluate(config, str(workdir))
    trained = load_trained(workdir)
    target = jax.tree.map(ocp.utils.to_shape_dtype_struct, trained.params)
    checkpointer = Checkpointer(workdir, read_only=True)
    try:
        raw, step = checkpointer.restore_params(target)
    finally:
        checkpointer.close()
    assert step == trained.step == 8
    differences = jax.tree.leaves(
        jax.tree.map(
            lambda a, b: float(np.abs(np.asarray(a) - np.asarray(b)).max()), raw, trained.params
        )
    )
    assert max(differences) > 1e-4  # x is not y
    sources = [sample["source"] for sample in results["samples"]]
    options = trained.experiment.eval.decode
    translated = inference.translate(
        trained.model, trained.params, trained.tokenizer, sources, options
    )
    assert translated == [sample["model"] for sample in results["samples"]]


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            {"optimizer.name": "schedule_free_adamw"},
            r"--config.schedule='cosine': optimizer.name='schedule_free_adamw' averages",
        ),
        (
            {"optimizer.name": "schedule_free_adamw", "schedule": "constant", "b1": 0.0},
            r"--config.b1=0.0: must be in \(0, 1\)",
        ),
        ({"optimizer.muon.momentum": -0.1}, r"--config.optimizer.muon.momentum=-0.1"),
        (
            {"optimizer.muon.learning_rate": -1.0},
            r"--config.optimizer.muon.learning_rate=-1.0",
        ),
    ],
)
def test_optimizer_settings_are_refused_by_name(tmp_path, overrides, message):
    config = tiny_config(write_tiny_tsv(tmp_path), **overrides)
    with pytest.raises(ValueError, match=message):
        config_lib.validate_config(config)


def test_schedule_free_refuses_fine_tuning_groups(tmp_path):
    """A run from pretrained weights always has groups (train_lib.build_program): refused
    before its source is read for steps."""
    config = tiny_config(write_tiny_tsv(tmp_path), schedule="constant")
    config.optimizer.name = "schedule_free_adamw"
    optimizer = OptimizerConfig.from_config(config)
    schedule = ScheduleConfig("constant", 1e-3, 0, 10)
    optimizer.check_run(schedule, fine_tuning=False)
    with pytest.raises(
        ValueError, match=r"--config.optimizer.name='schedule_free_adamw': keeps one average"
    ):
        optimizer.check_run(schedule, fine_tuning=True)
