"""Orbax checkpoints of a run: the train state plus a JSON item with the data-stream position.

In a run of several processes every process calls save and restore (orbax writes each
array's shards from the processes that hold them, and process 0 finalises the step);
the directory must be one that every process sees (a shared filesystem across hosts).

Layout: `workdir/checkpoints/<step>/{state, progress}`. 'state' is the TrainState pytree
(step, params, optimizer state, dropout PRNG key); 'progress' is JSON with the data stream's
`state_dict()` (epoch and position), so a resumed run sees exactly the batches an
uninterrupted run would have seen.

Saves are asynchronous by default (`asynchronous=True`; `--config.async_checkpoints`):
`save` returns once the state is copied to host memory (so the next train step may
overwrite the donated device buffers) and a background thread writes the files while the
steps go on. The next `save`, `wait` or `close` waits for that write first and raises its
error, if any, as a `CheckpointWriteError` naming the step; a write is committed by
renaming `<step>.orbax-checkpoint-tmp` to `<step>`, so a crash or SIGKILL during it leaves
the previous checkpoint as the newest one that restores. `asynchronous=False` writes
before `save` returns.

A checkpoint that no longer restores (a file truncated by a full disk, say) while an older one
does is damaged: `restore_newest_good` moves it aside to `checkpoints/<step>.corrupt`, logs
one line, and resumes from the older one.

A finished run is read back for inference by `train.program.trained.load_trained`.
"""

from __future__ import annotations

import logging
import os
import pathlib
from typing import Any

import orbax.checkpoint as ocp

from train.core import distributed
from train.core.failures import CheckpointError, CheckpointWriteError
from train.core.rundir import RunDir

# Suffix of a damaged checkpoint moved aside (orbax ignores names that are not step numbers).
CORRUPT_SUFFIX = ".corrupt"
# Characters of the underlying error kept at each end of a one-line report (TensorStore puts
# the file first and the cause, such as 'File too large', last).
_CAUSE_CHARS_EACH_END = 90
_STATE, _PROGRESS = "state", "progress"


def _drop_read_only_notice(record: logging.LogRecord) -> bool:
    """A logging filter: False for orbax's notice that a manager opened read-only."""
    return not record.getMessage().startswith("Given directory is read only")


def _one_line(err: BaseException) -> str:
    """`Type: message` of an orbax/TensorStore error, on one line and cut short (their
    messages can run to dozens of lines)."""
    detail = " ".join(str(err).split())
    if len(detail) > 2 * _CAUSE_CHARS_EACH_END + 5:
        detail = f"{detail[:_CAUSE_CHARS_EACH_END]} ... {detail[-_CAUSE_CHARS_EACH_END:]}"
    return f"{type(err).__name__}: {detail}"


class Checkpointer:
    """Saves every N steps (keeping the last K) and restores the latest, via orbax."""

    def __init__(
        self,
        workdir: str | os.PathLike,
        *,
        keep: int = 2,
        read_only: bool = False,
        asynchronous: bool = True,
    ):
        """Opens (or creates) `workdir/checkpoints`.

        Args:
            workdir: the run directory.
            keep: the number of most recent checkpoints kept.
            read_only: True to only restore (translate / sample programs).
            asynchronous: True to write in a background thread (`save` returns after the
                copy to host memory); False to write before `save` returns.
        """
        self.directory = RunDir(workdir).checkpoints
        if read_only and not self.directory.is_dir():
            raise FileNotFoundError(
                f"No checkpoints in {self.directory} ; train first with "
                f"`python -m train.main --workdir {pathlib.Path(workdir)}`."
            )
        options = ocp.CheckpointManagerOptions(
            # Read-only: no saves and nothing to delete (orbax warns when told otherwise).
            max_to_keep=None if read_only else keep,
            save_interval_steps=0 if read_only else 1,
            create=not read_only,
            read_only=read_only,
            enable_async_checkpointing=asynchronous and not read_only,
        )
        self._asynchronous = options.enable_async_checkpointing
        # The step being written in the background, and the newest step before it: what a
        # failed write reports.
        self._pending: tuple[int, int | None] | None = None
        # orbax warns 'Given directory is read only' for every read-only manager: for
        # translate and sample that line would come before their output, and says nothing.
        absl_logger = logging.getLogger("absl")
        absl_logger.addFilter(_drop_read_only_notice)
        try:
            self._manager = ocp.CheckpointManager(
                self.directory, options=options, item_names=(_STATE, _PROGRESS)
            )
        finally:
            absl_logger.removeFilter(_drop_read_only_notice)

    def latest_step(self) -> int | None:
        """The newest saved step, or None."""
        return self._manager.latest_step()

    def save(self, step: int, state: Any, progress: dict[str, Any]) -> None:
        """Saves the state and the JSON-serialisable progress dict as checkpoint `step`.

        Asynchronous: first waits for the previous write (raising its error), then returns
        once `state` is copied to host memory, while the files are written in the
        background; `wait` (or the next save, or `close`) reports how that write ended.

        Raises:
            CheckpointWriteError: this write failed (synchronous), or the previous one did
                (asynchronous); the checkpoints saved before are untouched, and the
                half-written one stays in a `<step>.orbax-checkpoint-tmp` directory that
                restoring ignores.
        """
        self.wait()
        previous = self.latest_step()
        try:
            self._manager.save(
                step,
                args=ocp.args.Composite(
                    **{
                        _STATE: ocp.args.StandardSave(state),
                        _PROGRESS: ocp.args.JsonSave(progress),
                    }
                ),
                force=True,
            )
        except Exception as err:  # TensorStore reports I/O errors as ValueError, orbax others
            raise self._write_error(step, previous, err) from err
        self._pending = (step, previous)
        if not self._asynchronous:
            self.wait()

    def wait(self) -> None:
        """Blocks until the write in the background (if any) is finished.

        Raises:
            CheckpointWriteError: that write failed (names its step).
        """
        pending, self._pending = self._pending, None
        try:
            self._manager.wait_until_finished()
            self._manager.check_for_errors()
        except Exception as err:  # as in `save`
            step, previous = pending or (None, self.latest_step())
            raise self._write_error(step, previous, err) from err

    def _write_error(self, step: int | None, previous: int | None, err: Exception):
        """The one-line CheckpointWriteError of a failed write of checkpoint `step`."""
        resume = f"it resumes from step {previous}" if previous is not None else "it starts over"
        return CheckpointWriteError(
            f"Could not write checkpoint {step} in {self.directory} ({_one_line(err)}) ; "
            f"free disk space or fix the cause, then rerun the same command: {resume}."
        )

    def restore(self, target_state: Any, step: int | None = None) -> tuple[Any, dict[str, Any]]:
        """Restores a checkpoint into the structure, shapes and placement of `target_state`.

        Args:
            target_state: a state like the saved one (e.g. freshly initialised), whose
                arrays' shardings the restored arrays take.
            step: which checkpoint; None for the latest.

        Returns:
            (state, progress dict).

        Raises:
            FileNotFoundError: there is no checkpoint.
            CheckpointError: the checkpoint does not match this model or is corrupt (a
                ValueError and a RunFailure).
        """
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"No checkpoint in {self.directory} ; train first.")
        try:
            restored = self._manager.restore(
                step,
                args=ocp.args.Composite(
                    **{
                        _STATE: ocp.args.StandardRestore(target_state),
                        _PROGRESS: ocp.args.JsonRestore(),
                    }
                ),
            )
        except Exception as err:  # orbax raises many types for shape/structure/IO errors
            raise CheckpointError(
                f"Checkpoint {self.directory / str(step)} cannot be restored into this model "
                f"({_one_line(err)}) ; it is damaged or from a different config: delete it "
                "or use a fresh --workdir."
            ) from err
        return restored[_STATE], restored[_PROGRESS]

    def restore_params(self, target_params: Any) -> tuple[Any, int]:
        """Reads only the parameters of the newest checkpoint that restores (inference).

        Nothing is moved or deleted: a damaged newer checkpoint is reported in one warning
        line and an older one is used; the training program, when rerun, moves it aside.

        Args:
            target_params: a params tree of `jax.ShapeDtypeStruct`s (shapes, dtypes and
                shardings to restore into), e.g. from `jax.eval_shape` of the model's init.

        Returns:
            (params, step).

        Raises:
            FileNotFoundError: there is no checkpoint.
            CheckpointError: no checkpoint restores (the newest one's error).
        """
        parts, step = self.restore_parts({"params": target_params})
        return parts["params"], step

    def restore_parts(self, targets: dict[str, Any]) -> tuple[dict[str, Any], int]:
        """`restore_params` for several fields of the saved state: e.g. `{'params': ...,
        'opt_state': ...}` (schedule-free AdamW's evaluation parameters need both).

        Args:
            targets: field name -> a tree of `jax.ShapeDtypeStruct`s to restore into.

        Returns:
            ({field: restored tree}, step).
        """
        steps = sorted(self._manager.all_steps(), reverse=True)
        if not steps:
            raise FileNotFoundError(
                f"No checkpoint in {self.directory} ; train first with `python -m train.main "
                f"--workdir {self.directory.parent}`."
            )
        restore_args = ocp.checkpoint_utils.construct_restore_args(targets)
        first_error = None
        for step in steps:
            try:
                restored = self._manager.restore(
                    step,
                    args=ocp.args.Composite(
                        **{
                            _STATE: ocp.args.PyTreeRestore(
                                item=targets, restore_args=restore_args, partial_restore=True
                            )
                        }
                    ),
                )
            except Exception as err:  # as in `restore`
                error = CheckpointError(
                    f"Checkpoint {self.directory / str(step)} cannot be restored into the "
                    f"model of this run's config.json ({_one_line(err)}) ; it is damaged: "
                    "rerun `python -m train.main` on this work directory to resume from an "
                    "older checkpoint, or retrain."
                )
                error.__cause__ = err
                first_error = first_error or error
                continue
            if step != steps[0]:
                logging.warning("%s; using step %d instead.", first_error, step)
            return {name: restored[_STATE][name] for name in targets}, step
        raise first_error

    def restore_newest_good(self, target_state: Any) -> tuple[Any, dict[str, Any]]:
        """Restores the newest checkpoint that restores; damaged newer ones are moved aside.

        A checkpoint that fails while an older one restores is taken as damaged: it is moved
        to `checkpoints/<step>.corrupt` (kept for inspection) with one warning line, so the
        run retrains from the older step. When none restores, nothing is moved: then the
        likely cause is a different config, not damage.

        Args:
            target_state: as for `restore`.

        Returns:
            (state, progress dict) of the newest good checkpoint.

        Raises:
            FileNotFoundError: there is no checkpoint.
            CheckpointError: no checkpoint restores (the newest one's error).
        """
        steps = sorted(self._manager.all_steps(), reverse=True)
        if not steps:
            raise FileNotFoundError(f"No checkpoint in {self.directory} ; train first.")
        failed = []
        for step in steps:
            try:
                restored = self.restore(target_state, step)
            except CheckpointError as err:
                failed.append((step, err))
                continue
            if distributed.is_primary():  # one process renames; the others wait for it
                for bad, err in failed:
                    self._move_aside(bad, err, step)
            if failed:
                distributed.barrier("checkpoint-moved-aside")
                self._manager.reload()
            return restored
        raise failed[0][1]

    def _move_aside(self, step: int, err: CheckpointError, good_step: int) -> None:
        """Renames checkpoint `step` to `<step>.corrupt` (`.corrupt.1`, ... if taken)."""
        source = self.directory / str(step)
        target = self.directory / f"{step}{CORRUPT_SUFFIX}"
        count = 0
        while target.exists():
            count += 1
            target = self.directory / f"{step}{CORRUPT_SUFFIX}.{count}"
        os.replace(source, target)
        logging.warning(
            "Checkpoint %s is damaged (%s) ; moved it to %s and resumed from step %d.",
            source,
            _one_line(err.__cause__ or err),
            target,
            good_step,
        )

    def close(self) -> None:
        """Waits for the pending write and releases the manager.

        Raises:
            CheckpointWriteError: the pending write failed (the manager is released first).
        """
        try:
            self.wait()
        finally:
            self._manager.close()
