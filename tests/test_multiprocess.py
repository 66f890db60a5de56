"""One training run as several processes (JAX's distributed runtime, CPU collectives
through gloo), each feeding only its share of every batch.

The slow test starts real processes on 127.0.0.1 with `train.launch_local`: 2 processes x 4
CPU devices under a (2, 2, 2) mesh must train exactly as 1 process x 8 devices, and a run
whose process 1 is SIGKILLed after the first checkpoint must, once restarted, end where the
uninterrupted run ends. The fast tests check the data shares as pure functions.
"""

import json
import pathlib
import subprocess
import sys

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from train_helpers import tiny_config, write_tiny_tsv

from train import launch_local
from train.core import distributed
from train.core.rundir import RunDir
from train.data import batching, packing
from train.program import metrics
from train.tasks import TASKS

REPO = pathlib.Path(__file__).resolve().parent.parent
# Every run of the slow test is stopped after this long, whatever happens.
RUN_TIMEOUT_S = 300
STEPS, CHECKPOINT_EVERY, KILL_AT_STEP = 8, 4, 6
# Runs train.main with a step callback that SIGKILLs process 1 after step KILL_AT_STEP, once
# checkpoint CHECKPOINT_EVERY is committed: it is written in the background (asynchronous
# checkpoints), and on a busy machine the kill could otherwise come before the commit. The
# deadline only turns a commit that never comes into a clear failure.
_KILLING_MAIN = (
    "import os, signal, sys, time\n"
    "import jax\n"
    "from train import main\nfrom train.program import loop as train_lib\n"
    "from train.core.rundir import RunDir\n"
    "real = train_lib.train_and_evaluate\n"
    "workdir = sys.argv[sys.argv.index('--workdir') + 1]\n"
    f"committed = RunDir(workdir).checkpoints / '{CHECKPOINT_EVERY}'\n"
    "def kill(step):\n"
    f"    if step == {KILL_AT_STEP} and jax.process_index() == 1:\n"
    "        deadline = time.monotonic() + 120\n"
    "        while not committed.is_dir():\n"
    "            if time.monotonic() > deadline:\n"
    "                sys.exit(f'{committed} was not committed within 120 s')\n"
    "            time.sleep(0.01)\n"
    "        os.kill(os.getpid(), signal.SIGKILL)\n"
    "train_lib.train_and_evaluate = lambda c, w, **kw: real(c, w, step_callback=kill, **kw)\n"
    "sys.argv = ['train.main', *sys.argv[1:]]\n"
    "main.run()\n"
)


def _pairs(num: int) -> list[tuple[list[int], list[int]]]:
    """Distinct toy pairs of varied lengths; pair i's source starts with i + 1."""
    rng = np.random.default_rng(0)
    return [
        ([i + 1, *rng.integers(1, 50, rng.integers(0, 6))], list(rng.integers(1, 50, 3)))
        for i in range(num)
    ]


@pytest.mark.parametrize("count", [1, 2, 4])
def test_process_shares_cover_every_example_once_in_the_global_order(count):
    pairs = _pairs(37)  # not a multiple of the batch: the last batches are part padding
    task = TASKS["translation"]
    sides = [task.to_sides(pair) for pair in pairs]
    kwargs = dict(bucket_lengths=(4, 8), batch_size=8, rng=np.random.default_rng([3, 0]))
    whole = batching.bucketed_batches(task.sides, sides, **kwargs)
    parts = [
        batching.bucketed_batches(
            task.sides,
            sides,
            **{**kwargs, "rng": np.random.default_rng([3, 0])},
            share=batching.RowShare(index, count),
        )
        for index in range(count)
    ]
    seen = []
    for b, batch in enumerate(whole):
        for key, rows in batch.items():  # the shares, stacked, are the single-process batch
            stacked = np.concatenate([part[b][key] for part in parts])
            np.testing.assert_array_equal(stacked, rows)
        for part in parts:
            assert part[b]["src"].shape == (8 // count, batch["src"].shape[1])
            seen += [int(row[0]) for row in part[b]["src"] if row.any()]
    assert sorted(seen) == list(range(1, 38))  # every example once, none twice


@pytest.mark.parametrize("packed", [False, True])
def test_language_model_shares_stack_into_the_global_batches(packed):
    task = TASKS["lm"]
    lines = [task.to_sides(list(range(1, 2 + i % 7))) for i in range(23)]
    if packed:
        make = lambda share: packing.stream_batches(
            task.sides, lines, seq_len=8, batch_size=4, rng=np.random.default_rng(1), share=share
        )
    else:
        make = lambda share: batching.bucketed_batches(
            task.sides,
            lines,
            bucket_lengths=(8,),
            batch_size=4,
            rng=np.random.default_rng(1),
            share=share,
        )
    whole = make(batching.WHOLE_BATCH)
    parts = [make(batching.RowShare(i, 2)) for i in range(2)]
    assert len(parts[0]) == len(parts[1]) == len(whole)
    for b, batch in enumerate(whole):
        for key, rows in batch.items():
            np.testing.assert_array_equal(np.concatenate([p[b][key] for p in parts]), rows)


def test_a_batch_that_does_not_split_over_the_processes_is_refused():
    with pytest.raises(ValueError, match="6 rows does not split evenly over 4 processes"):
        batching.RowShare(1, 4).rows(6)
    with pytest.raises(ValueError, match=r"index=2 must be in \[0, count=2\)"):
        batching.RowShare(2, 2)


def test_decoding_shares_cover_every_sentence_once():
    for num in (0, 1, 3, 10):
        for count in (1, 2, 3):
            shares = [distributed.share_of_process(num, i, count) for i in range(count)]
            assert [i for share in shares for i in share] == list(range(num))


def test_distributed_settings_fall_back_to_the_environment(monkeypatch):
    for name in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):
        monkeypatch.delenv(name, raising=False)
    assert distributed.settings_from_env(None, None, None) == (None, 1, 0)
    monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "10.0.0.1:8476")
    monkeypatch.setenv("JAX_NUM_PROCESSES", "4")
    monkeypatch.setenv("JAX_PROCESS_ID", "3")
    assert distributed.settings_from_env(None, None, None) == ("10.0.0.1:8476", 4, 3)
    assert distributed.settings_from_env("h:1", 2, 1) == ("h:1", 2, 1)  # flags win
    monkeypatch.setenv("JAX_PROCESS_ID", "one")
    with pytest.raises(ValueError, match=r"\$JAX_PROCESS_ID='one' must be an integer"):
        distributed.settings_from_env(None, None, None)


def _default_config(**fields):
    from configs import default

    config = default.get_config()
    config.update(fields)
    return config


@pytest.mark.parametrize(
    "fields, cores, expected",
    [
        (dict(task="lm", packing="stream", batch_size=12, max_len=64), 2, 2),
        (dict(task="lm", packing="stream", batch_size=12, max_len=64), 3, 3),
        # at most AUTO_MAX_CPU_DEVICES (4), each holding a copy of the state
        (dict(task="lm", packing="stream", batch_size=12, max_len=64), 16, 4),
        (dict(task="lm", packing="stream", batch_size=30, max_len=64), 16, 3),
        (dict(task="lm", packing="stream", batch_size=7, max_len=64), 2, 1),
        # the default: whole examples packed, 2048 // 96 = 21 rows per batch
        (dict(), 2, 1),
        (dict(), 4, 3),
        (dict(), 1, 1),
        # rows per bucket come from tokens_per_batch: no split, the batches stay as they are
        (dict(packing="none"), 4, 1),
        # a mesh that names its sizes is the user's layout
        (dict(task="lm", packing="stream", batch_size=12, mesh_shape=(1, 1, 1)), 2, 1),
        (dict(task="lm", packing="stream", batch_size=12, mesh_shape=(-1, 1, 2)), 2, 1),
    ],
)
def test_auto_cpu_devices_divide_every_batch_into_equal_rows(fields, cores, expected):
    assert distributed.auto_cpu_devices(_default_config(**fields), cores) == expected


def test_split_cpu_sets_the_host_device_flag_only_before_jax_starts(monkeypatch):
    from jax._src import xla_bridge

    lm = _default_config(task="lm", packing="stream", batch_size=12, max_len=64)
    monkeypatch.setattr(distributed, "usable_cores", lambda: 2)
    monkeypatch.setattr(xla_bridge, "backends_are_initialized", lambda: False)
    env = {"XLA_FLAGS": "--xla_cpu_enable_fast_math=false"}
    assert distributed.split_cpu(lm, environ=env) == 2
    assert env["XLA_FLAGS"].split() == [
        "--xla_cpu_enable_fast_math=false",
        "--xla_force_host_platform_device_count=2",
    ]
    # A count given by the user's XLA_FLAGS or a launcher stays; several processes: none.
    env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
    assert distributed.split_cpu(lm, environ=env) == 1
    assert env == {"XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
    env = {}
    assert distributed.split_cpu(lm, num_processes=2, environ=env) == 1 and env == {}
    # An explicit count wins over auto; 1 sets nothing.
    lm.cpu_devices = 3
    assert distributed.split_cpu(lm, environ=env) == 3
    assert env["XLA_FLAGS"] == "--xla_force_host_platform_device_count=3"
    lm.cpu_devices, env = 1, {}
    assert distributed.split_cpu(lm, environ=env) == 1 and env == {}
    # Once JAX has started the flag would do nothing: it is not set.
    monkeypatch.setattr(xla_bridge, "backends_are_initialized", lambda: True)
    lm.cpu_devices = 0
    assert distributed.split_cpu(lm, environ=env) == 1 and env == {}


@pytest.mark.parametrize(
    "env, processes, started, why",
    [
        ({"XLA_FLAGS": "--xla_force_host_platform_device_count=4"}, 1, False, "XLA_FLAGS"),
        ({}, 2, False, "the run has several processes"),
        ({}, 1, True, "JAX had started"),
    ],
)
def test_an_explicit_cpu_device_count_that_cannot_apply_is_a_warning(
    monkeypatch, caplog, env, processes, started, why
):
    from jax._src import xla_bridge

    monkeypatch.setattr(xla_bridge, "backends_are_initialized", lambda: started)
    config = _default_config(task="lm", packing="stream", batch_size=12, cpu_devices=2)
    with caplog.at_level("WARNING"):
        assert distributed.split_cpu(config, num_processes=processes, environ=env) == 1
    assert f"--config.cpu_devices=2 is not applied: {why}" in caplog.text
    caplog.clear()
    config.cpu_devices = 0  # auto says nothing
    with caplog.at_level("WARNING"):
        distributed.split_cpu(config, num_processes=processes, environ=env)
    assert caplog.text == ""


def test_a_negative_cpu_device_count_is_refused_by_name():
    from train.config import config_lib

    with pytest.raises(ValueError, match=r"--config.cpu_devices=-1"):
        config_lib.validate_config(_default_config(cpu_devices=-1))


_QUEUED_STEPS_SCRIPT = """
import os, sys
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
import jax
import numpy as np
sys.path.insert(0, {tests!r})
from train_helpers import tiny_config
from train.program import loop as train_lib
from train.config import config_lib
from train.program import metrics, steps
from train import tasks
assert jax.device_count() == 2
# 1. Validation: 300 batches, more than XLA's in-process all-reduce survives queued at once.
config = tiny_config({corpus!r}, task="lm", corpus="text", packing="stream", num_train_steps=300,
                     log_every_steps=1000, eval_every_steps=1000, checkpoint_every_steps=1000,
                     bleu_examples=0, sample_prompts=("In",))
experiment = config_lib.validate_config(config)
task = tasks.get_task("lm")
mesh = train_lib.make_mesh(experiment.run.mesh_shape)
program = train_lib.build_program(experiment, task, mesh, 260, unk_id=1)
state = steps.create_train_state(program.model, task, program.tx, mesh, 0, "threefry2x32")
rng = np.random.default_rng(0)
batches = [
    {{key: rng.integers(1, 260, (16, 16)).astype(np.int32) for key in ("inputs", "targets")}}
    for _ in range(300)
]
out = metrics.evaluate_loss(program.eval_step, state.params, batches, program.put_batch)
assert out["tokens"] == 300 * 16 * 16, out
# 2. Training: 300 steps with no metrics fetch in between (log_every_steps=1000).
train_lib.train_and_evaluate(config, {workdir!r})
print("done")
"""


def test_hundreds_of_queued_steps_on_two_cpu_devices_do_not_deadlock(tmp_path):
    # XLA's in-process all-reduce (several CPU devices in one process, as train.main's
    # --config.cpu_devices makes) aborts after 40 s when a few hundred steps are dispatched
    # before any is waited for; validation and the training loop bound what is in flight.
    corpus = tmp_path / "lines.txt"
    corpus.write_text("".join(f"line {i} of a small text, said the tester.\n" for i in range(400)))
    script = _QUEUED_STEPS_SCRIPT.format(
        tests=str(pathlib.Path(__file__).parent), corpus=str(corpus), workdir=str(tmp_path / "run")
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=240
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("done")


def test_bad_distributed_flags_are_usage_errors():
    with pytest.raises(ValueError, match="needs --coordinator_address"):
        distributed.initialize(None, 2, 0)
    with pytest.raises(ValueError, match=r"--process_id=2 must be in \[0, 2\)"):
        distributed.initialize("127.0.0.1:1", 2, 2)


def _config_file(directory: pathlib.Path, corpus: pathlib.Path) -> pathlib.Path:
    """A config file holding the tiny run of tests/train_helpers.py on a (2, 2, 2) mesh.

    The model has no attention biases: softmax ignores a shift shared by all keys, so the
    key bias gets only rounding noise as its gradient, which Adam scales up to steps as large
    as the learning rate; a different summation order (across processes through gloo, or
    within one) would show there alone, as differences of ~1e-6 in parameters near 0.
    """
    config = tiny_config(
        corpus,
        num_train_steps=STEPS,
        checkpoint_every_steps=CHECKPOINT_EVERY,
        bleu_examples=3,  # odd: the two processes decode 2 and 1 sentences
        num_samples=3,  # all of them in results.json
        max_decode_len=4,
        mesh_shape=(2, 2, 2),
    )
    config.model.attention_bias = False
    path = directory / "tiny_config.py"
    path.write_text(
        "import ml_collections\n\n\n"
        f"def get_config():\n    return ml_collections.ConfigDict({config.to_dict()!r})\n"
    )
    return path


def _run(num_processes: int, devices: int, args: list[str], command=None) -> int:
    """Runs the processes to the end (or RUN_TIMEOUT_S); none is left running."""
    extra = {} if command is None else {"command": command}
    processes = launch_local.start(num_processes, devices, args, cwd=str(REPO), **extra)
    try:
        return launch_local.supervise(processes, timeout_s=RUN_TIMEOUT_S)
    finally:
        launch_local.stop(processes)


def _params(workdir: pathlib.Path, step: int) -> dict:
    """The parameters of checkpoint `step`, restored as numpy (this process has 1 device)."""
    path = RunDir(workdir).checkpoints / str(step) / "state"
    checkpointer = ocp.PyTreeCheckpointer()
    tree = checkpointer.metadata(path).item_metadata.tree
    restore = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree)
    state = checkpointer.restore(path, args=ocp.args.PyTreeRestore(restore_args=restore))
    return state["params"]


def _losses(workdir: pathlib.Path) -> list[tuple]:
    """(step, split, loss, nll, accuracy, tokens) of every train and valid record."""
    return [
        (r["step"], r["split"], r["loss"], r["nll"], r["accuracy"], r["tokens"])
        for r in metrics.read_metrics(RunDir(workdir).metrics)
        if r["split"] in ("train", "valid")
    ]


def _assert_same_training(workdir, reference):
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=0, atol=1e-6),
        _params(workdir, STEPS),
        _params(reference, STEPS),
    )
    got, want = _losses(workdir), _losses(reference)
    assert [r[:2] for r in got] == [r[:2] for r in want]
    np.testing.assert_allclose(
        np.asarray([r[2:] for r in got]), np.asarray([r[2:] for r in want]), rtol=0, atol=1e-6
    )


@pytest.mark.slow
def test_two_processes_train_as_one_and_resume_after_a_kill(tmp_path):
    config = str(_config_file(tmp_path, write_tiny_tsv(tmp_path)))
    one, two, killed = (tmp_path / name for name in ("one", "two", "killed"))

    def args(workdir):
        return ["--config", config, "--workdir", str(workdir)]

    assert _run(1, 8, args(one)) == 0
    assert _run(2, 4, args(two)) == 0
    _assert_same_training(two, one)
    assert (two / "loss_curve.png").exists()
    # BLEU sentences decoded 2 + 1 by the two processes, gathered back in order.
    results = [json.loads((run / "results.json").read_text()) for run in (one, two)]
    assert results[1]["bleu"]["examples"] == 3
    assert results[1]["samples"] == results[0]["samples"]

    # Process 1 dies after the checkpoint of step 4; process 0 must not outlive it for long.
    status = _run(2, 4, args(killed), command=(sys.executable, "-c", _KILLING_MAIN))
    assert status == 128 + 9, status
    saved = sorted(int(p.name) for p in RunDir(killed).checkpoints.iterdir() if p.name.isdigit())
    assert saved == [CHECKPOINT_EVERY]
    assert _run(2, 4, args(killed)) == 0  # both restarted: resumes at step 4
    _assert_same_training(killed, two)


# Runs train.main with a step callback in which process 1 alone gets a SIGTERM after step
# STOP_AT_STEP (a preemption notice that reaches one host first). The notice travels to the
# other process through JAX's coordination service, where the processes agree on the step
# to stop at: one past the newest step any of them had passed to
# `reached_preemption_sync_point` when its sync protocol published that step (xla/tsl
# preemption_sync_manager.cc; the step stays frozen until they agree). How long the notice
# takes is the machine's business (the runtime's SIGTERM listener alone looks once a
# second), and on a busy machine the run once reached its last step first. So both
# processes wait in the callback of STOP_AT_STEP, before the loop asks for the sync point,
# until every process's protocol has published its step: each published STOP_AT_STEP - 1,
# so they agree on STOP_AT_STEP whatever the timing. The key directory is JAX's own; the
# deadline only turns a change of it into a clear failure.
STOP_AT_STEP = 5
_TERMINATING_MAIN = (
    "import os, signal, sys, time\n"
    "import jax\n"
    "from jax._src import distributed as jax_distributed\n"
    "from train import main\nfrom train.program import loop as train_lib\n"
    "real = train_lib.train_and_evaluate\n"
    "def terminate(step):\n"
    f"    if step != {STOP_AT_STEP}:\n"
    "        return\n"
    "    if jax.process_index() == 1:\n"
    "        os.kill(os.getpid(), signal.SIGTERM)\n"
    "    client = jax_distributed.global_state.client\n"
    "    published = lambda: client.key_value_dir_get('PREEMPTION_CURRENT_COUNTER/')\n"
    "    deadline = time.monotonic() + 120\n"
    "    while len(published()) < jax.process_count():\n"
    "        if time.monotonic() > deadline:\n"
    "            sys.exit('no preemption sync protocol published its step within 120 s')\n"
    "        time.sleep(0.01)\n"
    "train_lib.train_and_evaluate = lambda c, w, **kw: real(c, w, step_callback=terminate, **kw)\n"
    "sys.argv = ['train.main', *sys.argv[1:]]\n"
    "main.run()\n"
)


@pytest.mark.slow
def test_a_sigterm_to_one_process_stops_both_at_one_step_and_the_rerun_finishes(tmp_path):
    config = str(_config_file(tmp_path, write_tiny_tsv(tmp_path)))
    workdir = tmp_path / "run"
    args = ["--config", config, "--workdir", str(workdir)]
    command = (sys.executable, "-c", _TERMINATING_MAIN)
    processes = launch_local.start(2, 4, args, cwd=str(REPO), command=command)
    try:
        # Both exit on their own, each after the one checkpoint they write together.
        statuses = [p.wait(timeout=RUN_TIMEOUT_S) for p in processes]
    finally:
        launch_local.stop(processes)
    assert statuses == [143, 143], statuses
    saved = sorted(int(p.name) for p in RunDir(workdir).checkpoints.iterdir() if p.name.isdigit())
    assert saved == [CHECKPOINT_EVERY, STOP_AT_STEP], saved
    assert _run(2, 4, args) == 0
    assert json.loads((workdir / "results.json").read_text())["step"] == STEPS


def test_train_lib_says_when_the_cpu_devices_asked_for_are_not_there(tmp_path, caplog):
    # In-process (a notebook, these tests) JAX has already started on its devices.
    from train.program import loop as train_lib

    config = tiny_config(write_tiny_tsv(tmp_path), num_train_steps=1, bleu_examples=0)
    config.cpu_devices = jax.local_device_count() + 1
    with caplog.at_level("WARNING"):
        train_lib.train_and_evaluate(config, str(tmp_path / "run"))
    assert (
        f"--config.cpu_devices={config.cpu_devices}: this process has "
        f"{jax.local_device_count()} CPU device(s)" in caplog.text
    )
