"""Asynchronous checkpoints (train.program.checkpoint): the loop goes on while a write is in flight,
a failed write is reported, and a write killed midway leaves the previous checkpoint.

The write is slowed or broken where orbax commits it: the rename of
`<step>.orbax-checkpoint-tmp` to `<step>`, done by orbax's background thread once every
file is written.
"""

import os
import pathlib
import signal
import subprocess
import sys
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from train.core.failures import CheckpointWriteError
from train.program import checkpoint, signals

REPO = pathlib.Path(__file__).resolve().parent.parent
# How long the slowed commit of a synchronous save takes: a save that returned before its
# write would find the checkpoint not yet committed.
SLOW_COMMIT_S = 0.75
# How long a commit held back by the test waits at most for the test to let it go.
HELD_WRITE_LIMIT_S = 120.0
_TMP_SUFFIX = ".orbax-checkpoint-tmp"


def _state(seed: int = 0) -> dict:
    keys = jax.random.split(jax.random.key(seed))
    return {
        "w": jax.random.normal(keys[0], (256, 256)),
        "b": jax.random.normal(keys[1], (256,)),
        "step": jnp.asarray(seed, jnp.int32),
    }


# A train step that donates its input, as train/program/steps.py's does.
_step = jax.jit(lambda s: jax.tree.map(lambda x: x * 2 + 1, s), donate_argnums=0)


def _committing(step: int, how):
    """An os.rename that calls `how()` before committing checkpoint `step`."""
    real = os.rename

    def rename(src, dst, *args, **kwargs):
        if os.path.basename(str(src)) == f"{step}{_TMP_SUFFIX}":
            how()
        return real(src, dst, *args, **kwargs)

    return rename


def test_save_returns_before_a_slow_write_and_the_steps_run_meanwhile(tmp_path, monkeypatch):
    # The commit waits until the test lets it go, so "before the write ends" is an order of
    # events, not a race against a clock: a `save` that waited for its write would wait
    # there until HELD_WRITE_LIMIT_S (a bound for a broken build only) and then find the
    # checkpoint committed.
    release = threading.Event()
    monkeypatch.setattr(os, "rename", _committing(1, lambda: release.wait(HELD_WRITE_LIMIT_S)))
    checkpointer = checkpoint.Checkpointer(tmp_path, asynchronous=True)
    state = _step(_state())
    saved = jax.tree.map(np.array, state)  # a copy, before the donating steps below
    checkpointer.save(1, state, {"stream": {"epoch": 0}, "step": 1})
    assert not release.is_set()
    assert sorted(p.name for p in checkpointer.directory.iterdir()) == [f"1{_TMP_SUFFIX}"]
    for _ in range(3):  # donate (and overwrite) the saved buffers while the write goes on
        state = _step(state)
    jax.block_until_ready(state)
    assert sorted(p.name for p in checkpointer.directory.iterdir()) == [f"1{_TMP_SUFFIX}"]
    release.set()
    checkpointer.wait()  # returns once the write is committed
    assert sorted(p.name for p in checkpointer.directory.iterdir()) == ["1"]
    restored, progress = checkpointer.restore(_state())
    checkpointer.close()
    assert progress == {"stream": {"epoch": 0}, "step": 1}
    jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, restored), saved)


def test_synchronous_save_returns_after_the_write(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "rename", _committing(1, lambda: time.sleep(SLOW_COMMIT_S)))
    checkpointer = checkpoint.Checkpointer(tmp_path, asynchronous=False)
    checkpointer.save(1, _state(), {"step": 1})
    assert [p.name for p in checkpointer.directory.iterdir()] == ["1"]
    checkpointer.close()


def test_a_failed_background_write_is_reported_at_the_next_save(tmp_path, monkeypatch):
    def disk_full():
        raise OSError(28, "No space left on device")

    checkpointer = checkpoint.Checkpointer(tmp_path, asynchronous=True)
    checkpointer.save(1, _state(1), {"step": 1})
    monkeypatch.setattr(os, "rename", _committing(2, disk_full))
    checkpointer.save(2, _state(2), {"step": 2})  # returns: the write fails later
    with pytest.raises(CheckpointWriteError) as err:
        checkpointer.save(3, _state(3), {"step": 3})
    message = str(err.value)
    assert message.startswith(f"Could not write checkpoint 2 in {checkpointer.directory} (")
    assert "No space left on device" in message and "\n" not in message
    assert message.endswith("then rerun the same command: it resumes from step 1.")
    checkpointer.close()  # the error was reported once: closing does not raise it again
    state, progress = checkpoint.Checkpointer(tmp_path).restore_newest_good(_state())
    assert progress == {"step": 1} and int(state["step"]) == 1


def test_a_failed_background_write_is_reported_at_close(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "rename", _committing(1, lambda: 1 / 0))
    checkpointer = checkpoint.Checkpointer(tmp_path, asynchronous=True)
    checkpointer.save(1, _state(), {"step": 1})
    with pytest.raises(
        CheckpointWriteError, match=r"checkpoint 1 .*ZeroDivisionError.*starts over"
    ):
        checkpointer.close()


# Saves checkpoint 1, then checkpoint 2, whose background write SIGKILLs the process midway.
_KILLED_WHILE_WRITING = """
import os, signal, sys
import jax, jax.numpy as jnp
from train.program import checkpoint
real = os.rename
def rename(src, dst, *args, **kwargs):
    if os.path.basename(str(src)) == "2.orbax-checkpoint-tmp":
        os.kill(os.getpid(), signal.SIGKILL)
    return real(src, dst, *args, **kwargs)
os.rename = rename
checkpointer = checkpoint.Checkpointer(sys.argv[1], asynchronous=True)
for step in (1, 2):
    state = {"w": jnp.full((64, 64), float(step)), "step": jnp.asarray(step)}
    checkpointer.save(step, state, {"step": step})
checkpointer.close()
"""


def test_a_write_killed_midway_leaves_the_previous_checkpoint(tmp_path):
    child = subprocess.run(
        [sys.executable, "-c", _KILLED_WHILE_WRITING, str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        timeout=120,
    )
    assert child.returncode == -signal.SIGKILL, child.stderr
    checkpointer = checkpoint.Checkpointer(tmp_path)
    assert sorted(p.name for p in checkpointer.directory.iterdir()) == ["1", f"2{_TMP_SUFFIX}"]
    target = {"w": jnp.zeros((64, 64)), "step": jnp.asarray(0)}
    state, progress = checkpointer.restore_newest_good(target)
    checkpointer.close()
    assert progress == {"step": 1}
    np.testing.assert_array_equal(np.asarray(state["w"]), np.ones((64, 64)))


def test_sigterm_notice_is_set_by_sigterm_and_the_old_handler_comes_back():
    seen = []
    previous = signal.signal(signal.SIGTERM, lambda *args: seen.append("old"))
    try:
        with signals.sigterm_notice() as notice:
            assert not notice.is_set()
            os.kill(os.getpid(), signal.SIGTERM)
            assert notice.wait(5)
        assert seen == []
        os.kill(os.getpid(), signal.SIGTERM)
        assert seen == ["old"]
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_sigterm_notice_outside_the_main_thread_installs_nothing():
    before = signal.getsignal(signal.SIGTERM)
    entered = []

    def body():
        with signals.sigterm_notice() as notice:
            entered.append(notice)

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    assert entered and signal.getsignal(signal.SIGTERM) is before
