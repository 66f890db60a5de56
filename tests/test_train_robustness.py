"""The training program's failure modes each end in one line and a documented exit
status (2 = usage: flag, config, data file; 1 = runtime: I/O, damaged checkpoint, lock held)."""

import errno
import json
import logging
import math
import os
import pathlib
import shutil
import subprocess
import sys

import pytest
from train_helpers import dataset_of, tiny_config, write_tiny_tsv

from train.config import config_lib
from train.core import rundir
from train.core.failures import RUN_ERROR, USAGE_ERROR, CheckpointError, RunFailure
from train.core.rundir import RunDir
from train.program import loop as train_lib
from train.program import metrics
from train.program.trained import load_trained

REPO = pathlib.Path(__file__).resolve().parent.parent

# A failed orbax restore leaves a callback for its closed asyncio loop, reported later at
# garbage collection; it is orbax's (see tests/test_train.py).
pytestmark = pytest.mark.filterwarnings(
    "ignore:Exception ignored in. None:pytest.PytestUnraisableExceptionWarning"
)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("field", ["learning_rate", "label_smoothing", "model.dropout_rate"])
def test_non_finite_config_floats_are_rejected(field, value, tmp_path):
    config = tiny_config(tmp_path / "pairs.tsv", **{field: value})
    with pytest.raises(ValueError, match=rf"--config\.{field}={value!r}: must be a finite"):
        config_lib.validate_config(config)


def _run(module, *args, timeout=120, code=None):
    """Runs `python -m module args` in the repository (or `python -c code args` when `code`
    is given), capturing its output."""
    how = ["-c", code] if code is not None else ["-m", module]
    return subprocess.run(
        [sys.executable, *how, *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=timeout,
    )


def _run_main(*args, timeout=120):
    return _run("train.main", *args, timeout=timeout)


def _one_error_line(result) -> str:
    """The single `error: ...` line a failing run prints last (after any log lines)."""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error: ")]
    assert "Traceback" not in result.stderr, result.stderr
    assert len(errors) == 1 and lines[-1] == errors[0], result.stderr
    return errors[0]


def test_missing_config_file_with_an_override_is_a_usage_error(tmp_path):
    result = _run_main(
        "--config", "nope.py", "--config.num_train_steps=3", "--workdir", str(tmp_path)
    )
    assert result.returncode == USAGE_ERROR
    assert _one_error_line(result).startswith("error: --config nope.py: no such file ; ")


@pytest.mark.parametrize("override", [[], ["--config.num_train_steps=3"]])
def test_config_file_with_a_syntax_error_is_a_usage_error(override, tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def get_config(:\n")
    result = _run_main("--config", str(bad), *override, "--workdir", str(tmp_path / "w"))
    assert result.returncode == USAGE_ERROR
    line = _one_error_line(result)
    assert line.startswith(f"error: --config {bad}: invalid syntax at line 1")
    assert "; fix the file" in line


def _tiny_args(tmp_path, workdir, **overrides) -> list[str]:
    """Command-line flags for a run of a few seconds on the toy corpus."""
    config = tiny_config(
        write_tiny_tsv(tmp_path), **{"num_train_steps": 2, "bleu_examples": 0, **overrides}
    )
    flat = {
        k: config[k]
        for k in ("corpus", "corpus_path", "tokenizer", "max_len", "batch_size")
        + ("tokens_per_batch", "num_train_steps", "bleu_examples", "report_beam_size")
        + ("copied_targets", "copy_baseline", "bleu_every_steps", "num_samples")
        + ("max_decode_len", "warmup_steps", "test_fraction", "valid_fraction")
        + ("log_every_steps", "eval_every_steps", "checkpoint_every_steps")
    }
    args = [f"--config.{k}={v}" for k, v in flat.items()]
    args += [
        f"--config.model.{k}={config.model[k]}"
        for k in ("d_model", "d_ff", "num_layers", "dropout_rate")
    ]
    return [*args, "--config.bucket_lengths=(16,)", "--workdir", str(workdir)]


def test_workdir_that_is_a_regular_file_is_a_usage_error(tmp_path):
    workdir = tmp_path / "run"
    workdir.write_text("not a directory\n")
    result = _run_main(*_tiny_args(tmp_path, workdir))
    assert result.returncode == USAGE_ERROR
    line = _one_error_line(result)
    assert line.startswith(f"error: --workdir {workdir}: {workdir} is a regular file")
    assert "; pass a directory" in line


def test_unwritable_workdir_is_a_run_failure(tmp_path, monkeypatch):
    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(rundir.tempfile, "mkstemp", read_only)
    with pytest.raises(RunFailure, match=r"--workdir .*run: cannot write there \(Read-only"):
        rundir.prepare_workdir(tmp_path / "run")


def test_unwritable_workdir_exits_with_the_run_failure_status(tmp_path):
    # Root ignores permissions, so the read-only mount is simulated inside the child.
    workdir = tmp_path / "run"
    script = (
        "import errno, os, sys, tempfile\n"
        "real = tempfile.mkstemp\n"
        "def mkstemp(*a, dir=None, **k):\n"
        f"    if str(dir) == {str(workdir)!r}:\n"
        "        raise OSError(errno.EROFS, os.strerror(errno.EROFS))\n"
        "    return real(*a, dir=dir, **k)\n"
        "tempfile.mkstemp = mkstemp\n"
        "from train import main\n"
        "sys.argv = ['train.main', *sys.argv[1:]]\n"
        "main.run()\n"
    )
    result = _run(None, *_tiny_args(tmp_path, workdir), timeout=120, code=script)
    assert result.returncode == RUN_ERROR
    line = _one_error_line(result)
    assert line == (
        f"error: --workdir {workdir}: cannot write there (Read-only file system) ; choose a "
        "writable --workdir, or fix its permissions or mount."
    )


@pytest.mark.slow  # two runs
def test_rerun_after_losing_results_json_does_not_duplicate_metrics(tmp_path):
    # A kill between the final checkpoint and results.json: the rerun restores the final step
    # and evaluates it again, which must not log its valid (or bleu) record a second time.
    config = tiny_config(write_tiny_tsv(tmp_path), num_train_steps=4)
    workdir = tmp_path / "run"
    train_lib.train_and_evaluate(config, str(workdir))
    before = metrics.read_metrics(RunDir(workdir).metrics)
    RunDir(workdir).results.unlink()
    train_lib.train_and_evaluate(config, str(workdir))
    after = metrics.read_metrics(RunDir(workdir).metrics)
    keys = [(r["step"], r["split"]) for r in after]
    assert len(keys) == len(set(keys)), keys
    assert after == before
    assert RunDir(workdir).results.is_file()


# Holds the lock of the folder argv[1] until the test closes its stdin or kills it (not for
# a while: a busy machine could outlast any while).
_HOLD_LOCK = (
    "import sys\n"
    "from train.core.rundir import WorkdirLock\n"
    "with WorkdirLock(sys.argv[1]):\n"
    "    print('locked', flush=True)\n"
    "    sys.stdin.read()\n"
)


def test_second_run_on_a_locked_workdir_exits_naming_the_holder(tmp_path):
    workdir = tmp_path / "run"
    workdir.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD_LOCK, str(workdir)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        result = _run_main(*_tiny_args(tmp_path, workdir))
        assert result.returncode == RUN_ERROR
        line = _one_error_line(result)
        assert line.startswith(
            f"error: --workdir {workdir} is in use by another run (pid {holder.pid} on "
        )
        assert "; wait for it to finish or stop it, or pass another --workdir." in line
        assert not (workdir / "checkpoints").exists()  # refused before writing anything
    finally:
        holder.kill()  # SIGKILL: the kernel releases the flock, the lock file stays
        holder.wait()
    # A lock file left by a killed run is not stale: the next run takes the lock.
    assert RunDir(workdir).lock.exists()
    with rundir.WorkdirLock(workdir):
        pass


def test_atomic_write_leaves_the_old_file_when_interrupted(tmp_path, monkeypatch):
    path = tmp_path / "results.json"
    rundir.atomic_write_text(path, "old\n")

    def killed(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(rundir.os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        rundir.atomic_write_text(path, "new\n")
    assert path.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]  # no temp file left


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A 4-step run and its flags; tests copy its work directory before damaging it."""
    tmp = tmp_path_factory.mktemp("finished")
    args = _tiny_args(tmp, tmp / "run")
    result = _run_main(*args, timeout=300)
    assert result.returncode == 0, result.stderr
    return tmp / "run", args[:-2]


@pytest.mark.slow  # a short run and four subprocesses
@pytest.mark.parametrize("content", ["", '{"task": "transl'])
def test_damaged_config_json_is_one_line_in_train_and_translate(content, finished_run, tmp_path):
    run, args = finished_run
    workdir = tmp_path / "run"
    shutil.copytree(run, workdir)
    (workdir / "config.json").write_text(content)
    what = "is empty" if not content else "is not valid JSON (Unterminated string"
    train = _run_main(*args, "--config.num_train_steps=6", "--workdir", str(workdir))
    assert train.returncode == RUN_ERROR
    line = _one_error_line(train)
    assert line.startswith(f"error: {workdir / 'config.json'} {what}")
    assert "; delete it and rerun with the run's --config" in line
    translate = _run("train.translate", "--workdir", str(workdir), "ab cd")
    assert translate.returncode == RUN_ERROR
    line = _one_error_line(translate)
    assert line.startswith(f"error: {workdir / 'config.json'} {what}")
    assert f"; delete it and rerun `python -m train.main --workdir {workdir}`" in line


def test_damaged_checkpoint_in_translate_is_a_one_line_run_failure(finished_run, tmp_path):
    run, _ = finished_run
    workdir = tmp_path / "run"
    shutil.copytree(run, workdir)
    for path in RunDir(workdir).checkpoints.rglob("manifest.ocdbt"):
        path.write_bytes(b"garbage")
    result = _run("train.translate", "--workdir", str(workdir), "ab cd")
    assert result.returncode == RUN_ERROR
    line = _one_error_line(result)
    assert line.startswith(
        f"error: Checkpoint {RunDir(workdir).checkpoints / '2'} cannot be restored"
    )
    assert line.endswith(
        "; it is damaged: rerun `python -m train.main` on this work directory to resume from "
        "an older checkpoint, or retrain."
    )


@pytest.mark.parametrize("num_pairs, warned", [(60, True), (300, False)])
def test_small_corpus_gets_a_warning_with_its_size(num_pairs, warned, tmp_path, caplog):
    config = tiny_config(write_tiny_tsv(tmp_path, num_pairs=num_pairs))
    with caplog.at_level(logging.WARNING):
        dataset = dataset_of(config, RunDir(tmp_path))
    found = [r.getMessage() for r in caplog.records if "training examples" in r.getMessage()]
    if warned:
        assert found == [
            f"Only {dataset.sizes['train']} training examples (fewer than 100): too few to "
            "train a model that generalises; use a larger corpus for meaningful results."
        ]
    else:
        assert not found


@pytest.mark.slow  # two runs
def test_damaged_latest_checkpoint_is_moved_aside_and_the_run_resumes(tmp_path, caplog):
    config = tiny_config(write_tiny_tsv(tmp_path), num_train_steps=8, bleu_examples=0)
    workdir = tmp_path / "run"
    train_lib.train_and_evaluate(config, str(workdir))
    ckpts = RunDir(workdir).checkpoints
    assert sorted(p.name for p in ckpts.iterdir()) == ["4", "8"]
    # A disk that filled up: every array data file of checkpoint 8 cut to half its size.
    data_files = [p for p in (ckpts / "8" / "state").rglob("d/*") if p.is_file()]
    assert data_files
    for path in data_files:
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    # Inference reads the older checkpoint, says so, and moves nothing.
    with caplog.at_level(logging.WARNING):
        trained = load_trained(workdir)
    assert trained.step == 4
    [warning] = [r.getMessage() for r in caplog.records if "cannot be restored" in r.getMessage()]
    assert warning.startswith(f"Checkpoint {ckpts / '8'} cannot be restored into the model of")
    assert warning.endswith("; using step 4 instead.") and "\n" not in warning
    assert sorted(p.name for p in ckpts.iterdir()) == ["4", "8"]
    caplog.clear()
    longer = config.copy_and_resolve_references()
    longer.num_train_steps = 12
    with caplog.at_level(logging.WARNING):
        results = train_lib.train_and_evaluate(longer, str(workdir))
    reports = [r.getMessage() for r in caplog.records if "is damaged" in r.getMessage()]
    assert len(reports) == 1 and "\n" not in reports[0]
    assert reports[0].startswith(f"Checkpoint {ckpts / '8'} is damaged (")
    assert reports[0].endswith(f"moved it to {ckpts / '8.corrupt'} and resumed from step 4.")
    assert results["step"] == 12
    assert sorted(p.name for p in ckpts.iterdir()) == ["12", "8", "8.corrupt"]
    steps = [r["step"] for r in metrics.read_metrics(RunDir(workdir).metrics)]
    assert steps == sorted(steps)  # the records after step 4 were rewritten, not repeated


@pytest.mark.slow  # two runs
def test_checkpoints_that_all_fail_are_left_in_place(tmp_path):
    config = tiny_config(write_tiny_tsv(tmp_path), num_train_steps=4, bleu_examples=0)
    workdir = tmp_path / "run"
    train_lib.train_and_evaluate(config, str(workdir))
    changed = config.copy_and_resolve_references()
    changed.optimizer.name = "adamw"  # not an identity field, but a different optimizer state
    changed.weight_decay = 0.1
    changed.num_train_steps = 6
    with pytest.raises(CheckpointError, match="damaged or from a different config"):
        train_lib.train_and_evaluate(changed, str(workdir))
    assert sorted(p.name for p in RunDir(workdir).checkpoints.iterdir()) == ["4"]


@pytest.mark.slow  # a run in a subprocess
def test_disk_full_during_the_run_is_a_run_failure(tmp_path):
    # The disk fills while metrics are written: simulated in the child, as ENOSPC.
    script = (
        "import errno, os, sys\n"
        "from train import main\n"
        "from train.program import metrics\n"
        "def write(self, *args):\n"
        "    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.path))\n"
        "metrics.MetricsWriter.write = write\n"
        "sys.argv = ['train.main', *sys.argv[1:]]\n"
        "main.run()\n"
    )
    workdir = tmp_path / "run"
    result = _run(None, *_tiny_args(tmp_path, workdir), timeout=300, code=script)
    assert result.returncode == RUN_ERROR
    assert _one_error_line(result) == (
        f"error: [Errno 28] No space left on device: '{workdir / 'metrics.jsonl'}' ; fix the "
        "cause and rerun the same command: it resumes from the last checkpoint."
    )


# Runs train.main in a child that SIGKILLs itself at a chosen moment: `replace:NAME` just
# before the temporary file of NAME is renamed over it (config.json, results.json,
# metrics.jsonl), `checkpoint:STEP` just before orbax renames the finished temporary
# directory of checkpoint STEP into place (all its data written, not yet committed).
_KILLED_AT = """
import os, signal, sys
kind, _, what = os.environ["KILL_AT"].partition(":")
def die():
    os.kill(os.getpid(), signal.SIGKILL)
if kind == "replace":
    real_replace = os.replace
    def replace(src, dst, *args, **kwargs):
        if os.path.basename(str(dst)) == what:
            die()
        return real_replace(src, dst, *args, **kwargs)
    os.replace = replace
elif kind == "checkpoint":
    real_rename = os.rename
    def rename(src, dst, *args, **kwargs):
        if os.path.basename(str(src)) == what + ".orbax-checkpoint-tmp":
            die()
        return real_rename(src, dst, *args, **kwargs)
    os.rename = rename
from train import main
sys.argv = ["train.main", *sys.argv[1:]]
main.run()
"""


def _run_killed(args, kill_at=None, kill_after_s=None):
    """Runs train.main with `args` in a child killed as `kill_at` says, or by SIGKILL from
    here after `kill_after_s` seconds; returns the exit status (-9 when killed)."""
    env = {**os.environ, "KILL_AT": kill_at or "none:"}
    child = subprocess.Popen(
        [sys.executable, "-c", _KILLED_AT, *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=REPO,
        env=env,
    )
    try:
        return child.wait(timeout=kill_after_s or 300)
    except subprocess.TimeoutExpired:
        child.kill()
        return child.wait()


def _final_state(workdir, step):
    """The raw checkpointed TrainState of `step` (params, opt state, PRNG key) as numpy.

    Restored as numpy arrays, whatever devices saved it (`train.main` splits a CPU into
    several devices: `--config.cpu_devices`)."""
    import jax
    import numpy as np
    import orbax.checkpoint as ocp

    path = RunDir(workdir).checkpoints / str(step) / "state"
    with ocp.PyTreeCheckpointer() as checkpointer:
        tree = checkpointer.metadata(path)
        tree = getattr(tree, "item_metadata", tree)
        tree = getattr(tree, "tree", tree)
        args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree)
        return checkpointer.restore(path, restore_args=args)


def _records(workdir):
    """The metrics records of a run, without the wall-clock ones."""
    records = metrics.read_metrics(RunDir(workdir).metrics)
    for record in records:
        for name in ("tokens_per_sec", "wall_s", "eval_s"):
            record.pop(name, None)
    return records


@pytest.mark.slow
def test_sigkill_at_any_moment_resumes_to_the_same_state(tmp_path):
    import jax
    import numpy as np

    steps = dict(num_train_steps=12, checkpoint_every_steps=4, eval_every_steps=4)
    steps.update(log_every_steps=2, **{"model.dropout_rate": 0.1})
    straight = tmp_path / "straight"
    assert _run_killed(_tiny_args(tmp_path, straight, **steps)) == 0

    workdir = tmp_path / "killed"
    args = _tiny_args(tmp_path, workdir, **steps)
    # Killed while config.json is written, while checkpoint 8 is committed, at a random
    # moment (seeded: the same in every CI run), and after the last checkpoint while
    # results.json is written; then the same command finishes the run.
    assert _run_killed(args, kill_at="replace:config.json") == -9
    assert not (workdir / "config.json").exists()
    assert _run_killed(args, kill_at="checkpoint:8") == -9
    assert sorted(p.name for p in RunDir(workdir).checkpoints.iterdir()) == [
        "4",
        "8.orbax-checkpoint-tmp",
    ]
    delay = np.random.default_rng(12).uniform(1.0, 6.0)
    _run_killed(args, kill_after_s=delay)  # may also have finished its work by then
    assert _run_killed(args, kill_at="replace:results.json") == -9
    assert not RunDir(workdir).results.exists()
    assert _run_killed(args) == 0

    a, b = _final_state(straight, 12), _final_state(workdir, 12)
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))  # bitwise
    assert _records(workdir) == _records(straight)  # none lost, none repeated
    done = [RunDir(workdir).results.name, "config.json", "data_fingerprint.json"]
    for name in done:
        texts = [(run / name).read_text() for run in (workdir, straight)]
        texts[1] = texts[1].replace(str(straight), str(workdir))
        if name == RunDir(workdir).results.name:  # the clock (wall_s) is each run's own
            texts = [{k: v for k, v in json.loads(t).items() if k != "wall_s"} for t in texts]
        assert texts[0] == texts[1], name


def test_changed_corpus_is_refused_on_resume(tmp_path):
    corpus = write_tiny_tsv(tmp_path)
    config = tiny_config(corpus, num_train_steps=4, bleu_examples=0)
    workdir = tmp_path / "run"
    train_lib.train_and_evaluate(config, str(workdir))
    # The same file, its columns swapped in place: same path, same size.
    lines = corpus.read_text(encoding="utf-8").splitlines()
    corpus.write_text(
        "".join("\t".join(reversed(line.split("\t"))) + "\n" for line in lines),
        encoding="utf-8",
    )
    longer = config.copy_and_resolve_references()
    longer.num_train_steps = 8
    with pytest.raises(ValueError, match=r"holds checkpoints trained on other data: \d+ train"):
        train_lib.train_and_evaluate(longer, str(workdir))
    assert sorted(p.name for p in RunDir(workdir).checkpoints.iterdir()) == ["4"]  # untouched


@pytest.mark.slow  # a run in a subprocess
def test_file_size_limit_while_writing_a_checkpoint_is_one_line(tmp_path):
    # RLIMIT_FSIZE in the child: TensorStore's writes of the first checkpoint fail with
    # EFBIG (Python ignores SIGXFSZ), as on a full disk.
    script = (
        "import resource, sys\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))\n"
        "from train import main\n"
        "sys.argv = ['train.main', *sys.argv[1:]]\n"
        "main.run()\n"
    )
    workdir = tmp_path / "run"
    result = _run(None, *_tiny_args(tmp_path, workdir), timeout=300, code=script)
    assert result.returncode == RUN_ERROR
    line = _one_error_line(result)
    assert line.startswith(
        f"error: Could not write checkpoint 2 in {RunDir(workdir).checkpoints} ("
    )
    assert "File too large" in line
    assert line.endswith(
        "; free disk space or fix the cause, then rerun the same command: it starts over."
    )
    assert len(result.stderr.splitlines()) < 20, result.stderr  # no library tracebacks


@pytest.mark.slow  # a run and two subprocesses
def test_visualize_on_a_locked_folder_and_on_a_missing_run(finished_run, tmp_path):
    run, _ = finished_run
    out = tmp_path / "pictures"
    out.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD_LOCK, str(out)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        result = _run("train.visualize", "--workdir", str(run), "--text", "ab", "--out", str(out))
    finally:
        holder.kill()
        holder.wait()
    assert result.returncode == RUN_ERROR
    line = _one_error_line(result)
    assert line.startswith(f"error: --out {out} is in use by another run (pid {holder.pid} on ")
    assert line.endswith("; wait for it to finish or stop it, or pass another --out.")
    assert sorted(p.name for p in out.iterdir()) == ["lock"]  # nothing written

    missing = _run("train.visualize", "--workdir", str(tmp_path), "--text", "ab")
    assert missing.returncode == USAGE_ERROR
    assert _one_error_line(missing).startswith(
        f"error: {tmp_path / 'config.json'} not found: {tmp_path} is not a training run "
        "directory ; train with"
    )


@pytest.mark.parametrize(
    "module, args, message",
    [
        ("train.translate", ["--workdir", "nowhere"], "no sentences ; give them as arguments"),
        ("train.sample", ["--workdir", "nowhere"], "no prompt ; give one: --prompt"),
        (
            "train.sample",
            ["--workdir", "nowhere", "--prompt", "a", "extra"],
            "unexpected arguments",
        ),
        ("train.main", ["--workdir", "nowhere", "extra"], "unexpected arguments ['extra']"),
        ("train.translate", ["--beam_size=x"], "--beam_size"),
    ],
)
def test_usage_mistakes_of_every_program_are_one_line_and_status_2(module, args, message):
    result = subprocess.run(
        [sys.executable, "-m", module, *args],
        input="",
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    assert message in _one_error_line(result)


# Runs train.main with a step callback that sends SIGTERM (a preemption notice) to its own
# process after step SIGTERM_AT: a real signal, at a step chosen for a repeatable test.
_SIGTERMED = """
import os, signal, sys
from train import main
from train.program import loop as train_lib
real = train_lib.train_and_evaluate
def notice(step):
    if step == int(os.environ["SIGTERM_AT"]):
        os.kill(os.getpid(), signal.SIGTERM)
train_lib.train_and_evaluate = lambda c, w, **kw: real(c, w, step_callback=notice, **kw)
sys.argv = ["train.main", *sys.argv[1:]]
main.run()
"""


@pytest.mark.slow  # three short runs in subprocesses
def test_sigterm_saves_at_the_next_step_and_the_rerun_resumes_exactly(tmp_path):
    import jax
    import numpy as np

    from train.core.failures import PREEMPTED

    steps = dict(num_train_steps=10, checkpoint_every_steps=4, eval_every_steps=5)
    steps.update(log_every_steps=5, **{"model.dropout_rate": 0.1})
    straight = tmp_path / "straight"
    assert _run_main(*_tiny_args(tmp_path, straight, **steps)).returncode == 0

    workdir = tmp_path / "preempted"
    args = _tiny_args(tmp_path, workdir, **steps)
    child = subprocess.run(
        [sys.executable, "-c", _SIGTERMED, *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "SIGTERM_AT": "6"},
        timeout=300,
    )
    assert child.returncode == PREEMPTED == 143, child.stderr
    lines = [line for line in child.stderr.splitlines() if line.strip()]
    ckpts = RunDir(workdir).checkpoints
    assert lines[-1] == (
        f"preempted: SIGTERM at step 6; checkpoint 6 saved in {ckpts} ; rerun the same "
        "command to resume."
    )
    assert "Traceback" not in child.stderr
    assert sorted(p.name for p in ckpts.iterdir()) == ["4", "6"]
    assert not RunDir(workdir).results.exists()
    assert _run_main(*args).returncode == 0

    a, b = _final_state(straight, 10), _final_state(workdir, 10)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))  # bitwise
    results = [rundir.read_json(RunDir(w).results, "") for w in (straight, workdir)]
    assert results[1]["valid"] == results[0]["valid"]
    # The same records, except that checkpoint 6 wrote the train summary of step 6, so that
    # of checkpoint 8 covers steps 7-8 instead of 6-8.
    extra = [r for r in _records(workdir) if r not in _records(straight)]
    assert [(r["step"], r["split"]) for r in extra] == [(6, "train"), (8, "train")]
