"""Orbax checkpoints of a run: the train state plus a JSON item with the data-stream position.

Layout: `workdir/checkpoints/<step>/{state, progress}`. 'state' is the TrainState pytree
(step, params, optimizer state, dropout PRNG key); 'progress' is JSON with the data stream's
`state_dict()` (epoch and position), so a resumed run sees exactly the batches an
uninterrupted run would have seen.

A checkpoint that no longer restores (a file truncated by a full disk, say) while an older one
does is damaged: `restore_newest_good` moves it aside to `checkpoints/<step>.corrupt`, logs
one line, and resumes from the older one.
"""

from __future__ import annotations

import logging
import os
import pathlib
from typing import Any

import orbax.checkpoint as ocp

from train.errors import CheckpointError

CHECKPOINT_DIR = "checkpoints"
# Suffix of a damaged checkpoint moved aside (orbax ignores names that are not step numbers).
CORRUPT_SUFFIX = ".corrupt"
# Characters of the underlying error kept in the one-line report of a damaged checkpoint.
_MAX_CAUSE_CHARS = 160
_STATE, _PROGRESS = "state", "progress"


def checkpoint_dir(workdir: str | os.PathLike) -> pathlib.Path:
    """Where a run's checkpoints live: `workdir/checkpoints`."""
    return pathlib.Path(workdir).absolute() / CHECKPOINT_DIR


class Checkpointer:
    """Saves every N steps (keeping the last K) and restores the latest, via orbax."""

    def __init__(self, workdir: str | os.PathLike, *, keep: int = 2, read_only: bool = False):
        """Opens (or creates) `workdir/checkpoints`.

        Args:
            workdir: the run directory.
            keep: the number of most recent checkpoints kept.
            read_only: True to only restore (translate / sample programs).
        """
        self.directory = checkpoint_dir(workdir)
        if read_only and not self.directory.is_dir():
            raise FileNotFoundError(
                f"No checkpoints in {self.directory}; train first with "
                f"`python -m train.main --workdir {pathlib.Path(workdir)}`."
            )
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep,
            create=not read_only,
            read_only=read_only,
            # Synchronous saves: a step's checkpoint is complete when save() returns, so
            # a run killed right after still resumes from it.
            enable_async_checkpointing=False,
        )
        self._manager = ocp.CheckpointManager(
            self.directory, options=options, item_names=(_STATE, _PROGRESS)
        )

    def latest_step(self) -> int | None:
        """The newest saved step, or None."""
        return self._manager.latest_step()

    def save(self, step: int, state: Any, progress: dict[str, Any]) -> None:
        """Saves the state and the JSON-serialisable progress dict as checkpoint `step`."""
        self._manager.save(
            step,
            args=ocp.args.Composite(
                **{_STATE: ocp.args.StandardSave(state), _PROGRESS: ocp.args.JsonSave(progress)}
            ),
            force=True,
        )
        self._manager.wait_until_finished()

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
            raise FileNotFoundError(f"No checkpoint in {self.directory}; train first.")
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
                f"({type(err).__name__}: {err}). It is corrupt or from a different config; "
                "delete it or use a fresh --workdir."
            ) from err
        return restored[_STATE], restored[_PROGRESS]

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
            raise FileNotFoundError(f"No checkpoint in {self.directory}; train first.")
        failed = []
        for step in steps:
            try:
                restored = self.restore(target_state, step)
            except CheckpointError as err:
                failed.append((step, err))
                continue
            for bad, err in failed:
                self._move_aside(bad, err, step)
            if failed:
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
        cause = err.__cause__ or err
        detail = " ".join(str(cause).split())[:_MAX_CAUSE_CHARS]
        logging.warning(
            "Checkpoint %s is damaged (%s: %s); moved it to %s and resumed from step %d.",
            source,
            type(cause).__name__,
            detail,
            target,
            good_step,
        )

    def close(self) -> None:
        """Waits for pending writes and releases the manager."""
        self._manager.wait_until_finished()
        self._manager.close()
