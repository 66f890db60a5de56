"""Time to quality in the training program (issue 51): every record's `wall_s`, and runs
that stop at a target validation loss or BLEU."""

import json
import subprocess
import sys
import time

import pytest
from train_helpers import tiny_config, write_tiny_text, write_tiny_tsv

from train import tasks
from train.config import config_lib
from train.core.rundir import RunDir
from train.program import loop as train_lib
from train.program import metrics

# A failed orbax restore leaves a callback for its closed asyncio loop (as in test_train).
pytestmark = pytest.mark.filterwarnings(
    "ignore:Exception ignored in. None:pytest.PytestUnraisableExceptionWarning"
)


def _records(workdir):
    return metrics.read_metrics(RunDir(workdir).metrics)


def _checkpoints(workdir) -> list[int]:
    return sorted(int(p.name) for p in RunDir(workdir).checkpoints.iterdir() if p.name.isdigit())


def _assert_wall_time_in_every_record(records, since: float = 0.0):
    """wall_s in every record, not decreasing in file order, from `since` on; eval_s in
    the evaluations'."""
    walls = [r["wall_s"] for r in records]
    assert all(isinstance(w, float) for w in walls), records
    assert walls == sorted(walls) and walls[0] >= since, walls
    for record in records:
        if record["split"] == "valid":
            assert 0.0 < record["eval_s"] < record["wall_s"]


def _tensorboard_scalars(workdir) -> dict[str, list[tuple[int, float, float]]]:
    """tag -> [(step, value, event wall time)] of the run's TensorBoard event files (their
    TFRecord framing read here: tensorboardX writes events and reads none)."""
    import struct

    from tensorboardX.proto import event_pb2

    scalars: dict = {}
    for path in sorted(RunDir(workdir).tensorboard.glob("events.out.tfevents.*")):
        data, at = path.read_bytes(), 0
        while at < len(data):
            (length,) = struct.unpack("<Q", data[at : at + 8])
            event = event_pb2.Event.FromString(data[at + 12 : at + 12 + length])
            at += 12 + length + 4  # length, its crc, the record, its crc
            for value in event.summary.value:
                scalars.setdefault(value.tag, []).append(
                    (event.step, value.simple_value, event.wall_time)
                )
    return scalars


def test_run_clock_counts_from_the_start_and_on_from_a_checkpoint():
    clock = metrics.RunClock(started=time.time() - 5.0)
    assert 5.0 <= clock.seconds() < 6.0
    clock.resume(100.0)  # a checkpoint recorded 100 s: the restart adds its own seconds
    assert 105.0 <= clock.seconds() < 106.0
    # TensorBoard's wall time: as if the run had never stopped.
    assert clock.epoch(100.0) == pytest.approx(time.time() - 5.0, abs=1.0)
    assert metrics.RunClock().seconds() < 1.0


def test_a_resumed_clock_counts_on_after_the_records_the_stopped_run_kept(tmp_path):
    """A run that stopped at a checkpointed step wrote its report after the checkpoint (at
    that step, so the record is kept): the restart counts on from the report's clock, not the
    checkpoint's, and no record goes back in time (a race that failed test_wall_time once)."""
    run = RunDir(tmp_path / "run")
    run.metrics.parent.mkdir(parents=True, exist_ok=True)
    kept = [
        {"step": 4, "split": "valid", "wall_s": 10.0},
        {"step": 4, "split": "bleu", "wall_s": 50.0},
    ]
    lost = {"step": 6, "split": "train", "wall_s": 70.0}  # after the checkpoint: removed
    run.metrics.write_text("".join(json.dumps(r) + "\n" for r in [*kept, lost]))
    began = time.monotonic()
    clock = metrics.RunClock()
    clock.resume(12.0)  # the checkpoint at step 4 recorded 12 s
    writer = metrics.MetricsWriter(run, resume_step=4, clock=clock)
    try:
        writer.write(5, "train", {"loss": 1.0})
    finally:
        writer.close()
    restart = time.monotonic() - began  # this restart's own seconds (more on a loaded machine)
    walls = [r["wall_s"] for r in metrics.read_metrics(run.metrics)]
    # Counted on from the report's 50 s, not the checkpoint's 12 s plus the restart.
    assert walls[:2] == [10.0, 50.0] and 50.0 <= walls[2] <= 50.0 + restart, (walls, restart)


def test_every_record_has_wall_time_and_the_run_its_total(tmp_path):
    """A tiny translation run with interim BLEU: train, valid and bleu records all carry
    wall_s, in order; results.json has the total, at least the last record's."""
    config = tiny_config(write_tiny_tsv(tmp_path), bleu_every_steps=4)
    started = time.time()
    results = train_lib.train_and_evaluate(config, str(tmp_path / "run"), started=started)
    records = _records(tmp_path / "run")
    assert {r["split"] for r in records} == {"train", "valid", "bleu"}
    _assert_wall_time_in_every_record(records)
    assert [r["step"] for r in records if r["split"] == "bleu"] == [4, 8]
    assert records[-1]["wall_s"] <= results["wall_s"] <= time.time() - started
    assert "target" not in results  # no target asked
    saved = json.loads(RunDir(tmp_path / "run").results.read_text())
    assert saved["wall_s"] == results["wall_s"]
    # TensorBoard: <split>/wall_s, and each event's wall time on the same clock.
    scalars = _tensorboard_scalars(tmp_path / "run")
    valid = [r for r in records if r["split"] == "valid"]
    events = scalars["valid/wall_s"]
    assert [step for step, _, _ in events] == [r["step"] for r in valid]
    assert [value for _, value, _ in events] == pytest.approx([r["wall_s"] for r in valid])
    assert [when for _, _, when in events] == pytest.approx(
        [started + r["wall_s"] for r in valid], abs=1e-3
    )
    assert [step for step, _, _ in scalars["train/loss"]] == [2, 4, 6, 8]


def test_a_target_validation_loss_reached_early_stops_there(tmp_path, capsys):
    """Any loss is below 1000: the first evaluation (step 4 of 8) reaches the target; the
    run saves that step, reports, and a rerun returns the same results without training."""
    config = tiny_config(write_tiny_tsv(tmp_path), target_valid_loss=1000.0)
    workdir = tmp_path / "run"
    steps = []
    results = train_lib.train_and_evaluate(config, str(workdir), step_callback=steps.append)
    assert steps == [1, 2, 3, 4] and results["step"] == 4
    assert _checkpoints(workdir) == [4]
    valid = [r for r in _records(workdir) if r["split"] == "valid"]
    assert [r["step"] for r in valid] == [4]
    target = results["target"]
    assert target["reached"] and target["metric"] == "valid_loss" and target["step"] == 4
    assert target["value"] == results["valid"]["nll"] == valid[0]["nll"]
    assert target["wall_s"] == valid[0]["wall_s"] <= results["wall_s"]
    assert "bleu" in results  # the report as at the end of a full run
    out = capsys.readouterr().out
    assert "Target reached: validation loss" in out and "at step 4" in out
    saved = json.loads(RunDir(workdir).results.read_text())
    assert saved["target"] == target

    again = []
    assert train_lib.train_and_evaluate(config, str(workdir), step_callback=again.append) == saved
    assert again == []  # finished: nothing trained

    # Without the target the same directory trains on to the end, the clock counting on.
    config.target_valid_loss = 0.0
    results = train_lib.train_and_evaluate(config, str(workdir), step_callback=again.append)
    assert again == [5, 6, 7, 8] and results["step"] == 8 and "target" not in results
    records = _records(workdir)
    _assert_wall_time_in_every_record(records)
    resumed = [r for r in records if r["step"] > 4]
    assert resumed and min(r["wall_s"] for r in resumed) > target["wall_s"]


def test_a_target_bleu_stops_at_the_first_bleu_evaluation_reaching_it(tmp_path, monkeypatch):
    """The interim scores are stubbed (a tiny model's BLEU after two steps is 0): 10, then
    40 at step 4, reaching 30; the loop stops there and evaluates the loss of that step."""
    scores = iter([10.0, 40.0, 90.0])

    def interim_scores(self, evaluation, dataset, model, params):
        bleu = next(scores)
        return "bleu", {"bleu": bleu, "chrf": 50.0}, f"BLEU {bleu}"

    monkeypatch.setattr(tasks.TASKS["translation"].__class__, "interim_scores", interim_scores)
    config = tiny_config(
        write_tiny_tsv(tmp_path), bleu_every_steps=2, eval_every_steps=3, target_bleu=30.0
    )
    workdir = tmp_path / "run"
    results = train_lib.train_and_evaluate(config, str(workdir))
    target = results["target"]
    assert (target["reached"], target["metric"], target["step"], target["value"]) == (
        True,
        "bleu",
        4,
        40.0,
    )
    assert results["step"] == 4 and _checkpoints(workdir) == [4]
    records = _records(workdir)
    assert [(r["step"], r["split"]) for r in records if r["split"] != "train"] == [
        (2, "bleu"),
        (3, "valid"),
        (4, "bleu"),
        (4, "valid"),  # evaluated again at the step it stopped
        # (the final greedy BLEU of step 4 is not logged twice)
    ]
    assert target["wall_s"] == records[-2]["wall_s"]
    _assert_wall_time_in_every_record(records)


def test_a_target_not_reached_is_reported(tmp_path):
    config = tiny_config(write_tiny_tsv(tmp_path), target_valid_loss=1e-6)
    results = train_lib.train_and_evaluate(config, str(tmp_path / "run"))
    assert results["step"] == 8
    assert results["target"] == {"valid_loss": 1e-6, "bleu": 0.0, "reached": False, "step": 8}
    assert "Target (validation loss <= 1e-06) not reached in 8 steps" in metrics.format_report(
        results
    )


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(target_valid_loss=-1.0), r"--config.target_valid_loss=-1.0: must be a number >= 0"),
        (dict(target_bleu=101.0), r"--config.target_bleu=101.0: must be a number in \[0, 100\]"),
        (dict(target_bleu=30.0), r"--config.target_bleu=30.0: is checked at each BLEU eval"),
        (dict(target_bleu=30.0, bleu_every_steps=4, bleu_examples=0), r"bleu_examples > 0"),
        (dict(target_valid_loss=float("nan")), r"target_valid_loss=nan: must be a finite"),
    ],
)
def test_bad_targets_are_named(tmp_path, overrides, message):
    config = tiny_config(write_tiny_tsv(tmp_path), **overrides)
    with pytest.raises(ValueError, match=message):
        config_lib.validate_config(config)


def test_a_bleu_target_applies_to_translation_only(tmp_path):
    config = tiny_config(write_tiny_text(tmp_path), task="lm", corpus="text", target_bleu=30.0)
    with pytest.raises(ValueError, match=r"target_bleu=30.0: applies to task='translation'"):
        config_lib.validate_config(config)


@pytest.mark.slow  # a train.main process (jax start-up and compilation)
def test_the_command_reports_the_time_to_target_and_exits_normally(tmp_path):
    """`python -m train.main` counts from its own start: the first record's wall_s
    includes the start-up before any step (jax's import, compilation)."""
    corpus = write_tiny_tsv(tmp_path)
    workdir = tmp_path / "run"
    args = [
        f"--config.corpus_path={corpus}",
        "--config.corpus=tsv",
        "--config.tokenizer=byte",
        "--config.valid_fraction=0.1",
        "--config.test_fraction=0.0",
        "--config.max_len=16",
        "--config.bucket_lengths=(16,)",
        "--config.batch_size=16",
        "--config.tokens_per_batch=0",
        "--config.model.d_model=32",
        "--config.model.d_ff=64",
        "--config.model.num_heads=2",
        "--config.model.num_layers=1",
        "--config.num_train_steps=8",
        "--config.eval_every_steps=4",
        "--config.log_every_steps=2",
        "--config.checkpoint_every_steps=8",
        "--config.bleu_every_steps=0",
        "--config.bleu_examples=4",
        "--config.report_beam_size=1",
        "--config.copied_targets=0.0",
        "--config.target_valid_loss=1000.0",
        f"--workdir={workdir}",
    ]
    started = time.time()
    done = subprocess.run(
        [sys.executable, "-m", "train.main", *args], capture_output=True, text=True, timeout=600
    )
    elapsed = time.time() - started
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Target reached: validation loss" in done.stdout
    results = json.loads(RunDir(workdir).results.read_text())
    assert results["step"] == 4 and results["target"]["reached"]
    assert 0 < results["target"]["wall_s"] < results["wall_s"] < elapsed
    records = _records(workdir)
    _assert_wall_time_in_every_record(records)
    assert records[0]["wall_s"] > 1.0  # the command's start-up came before step 2
