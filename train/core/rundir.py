"""The run directory: every file name inside it, and how it is created, locked and written.

One run = one work directory; `RunDir` is the only place the names of its files are written:
  lock                    the pid and host of the run holding the directory's flock
  config.json             the config of the run (a rerun must keep its identity fields)
  data_fingerprint.json   sizes and hash of the train/validation data (a rerun must match)
  spm_<V>.model           the SentencePiece model, trained on the train split on first use
  pretrained/             the snapshot of `--config.init_from`'s config and tokenizer files
  chat_template.jinja     a chat or preference run's copy of its `--config.chat_template`
                          file, made at each start: the template it trained with
  token_store/            the token store of a text language model given no store_dir
  checkpoints/<step>      orbax checkpoints: train state + data-stream position
  reference_logps.npz     a preference run's reference log-probabilities, computed once
                          with the starting weights before step 1 (read again on resume)
  metrics.jsonl           train / valid / bleu records; tensorboard/ the same scalars
  loss_curve.png          train and validation loss against step
  results.json            the final validation metrics, BLEU/chrF and samples
  pictures/               what `train.visualize` draws (explorer.html among them)

Only one run may write a work directory at a time: `WorkdirLock` holds an exclusive
`fcntl.flock` on its lock file for the whole run. The kernel releases a flock when its
process exits, however it exits (a kill -9 or a crash included), so a lock file left behind
is never stale: the next run simply takes the lock. The file keeps the holder's pid and host
only to name them in the message of a run that finds the directory in use.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import pathlib
import socket
import tempfile
from typing import ClassVar

from train.core.failures import DamagedFileError, RunFailure


@dataclasses.dataclass(frozen=True)
class RunDir:
    """The paths of one run directory's files (nothing is created by naming them).

    Attributes:
        path: the directory (`--workdir`).
    """

    path: pathlib.Path

    # The snapshot of a pretrained source (`train.formats.sources.snapshot`), in a run directory
    # and in a token store alike.
    PRETRAINED: ClassVar[str] = "pretrained"

    def __post_init__(self):
        object.__setattr__(self, "path", pathlib.Path(self.path))

    @property
    def lock(self) -> pathlib.Path:
        return self.path / "lock"

    @property
    def config(self) -> pathlib.Path:
        return self.path / "config.json"

    @property
    def data_fingerprint(self) -> pathlib.Path:
        return self.path / "data_fingerprint.json"

    def tokenizer_model(self, vocab_size: int) -> pathlib.Path:
        """The SentencePiece model of a `vocab_size` vocabulary."""
        return self.path / f"spm_{vocab_size}.model"

    @property
    def pretrained(self) -> pathlib.Path:
        """The run's snapshot of `--config.init_from`'s config and tokenizer files."""
        return self.path / self.PRETRAINED

    def tokenizer_path(self, kind: str, vocab_size: int) -> pathlib.Path:
        """Where the run's tokenizer of `kind` ('byte', 'sentencepiece', 'pretrained') is
        read from (`train.data.tokenizers.open_tokenizer`): its SentencePiece model, or its
        snapshot of the pretrained model's tokenizer; the directory itself for bytes, which
        read no file."""
        if kind == "sentencepiece":
            return self.tokenizer_model(vocab_size)
        if kind == "pretrained":
            return self.pretrained
        return self.path

    @property
    def token_store(self) -> pathlib.Path:
        """The token store a text language model prepares when the config names none."""
        return self.path / "token_store"

    @property
    def checkpoints(self) -> pathlib.Path:
        """Absolute, as orbax wants it."""
        return self.path.absolute() / "checkpoints"

    @property
    def chat_template(self) -> pathlib.Path:
        """The run's copy of its own chat template file (`--config.chat_template`), which
        `train.sample --chat` and `train.export` read in place of the user's path."""
        return self.path / "chat_template.jinja"

    @property
    def reference_logps(self) -> pathlib.Path:
        """A preference run's reference log-probabilities per pair and split
        (`train.tasks.dpo.reference`)."""
        return self.path / "reference_logps.npz"

    @property
    def metrics(self) -> pathlib.Path:
        return self.path / "metrics.jsonl"

    @property
    def tensorboard(self) -> pathlib.Path:
        return self.path / "tensorboard"

    @property
    def loss_curve(self) -> pathlib.Path:
        return self.path / "loss_curve.png"

    @property
    def results(self) -> pathlib.Path:
        return self.path / "results.json"

    @property
    def pictures(self) -> pathlib.Path:
        return self.path / "pictures"

    @property
    def explorer(self) -> pathlib.Path:
        return self.pictures / "explorer.html"


def prepare_workdir(workdir: str | os.PathLike) -> pathlib.Path:
    """Creates `workdir` if missing and checks that files can be written in it.

    Args:
        workdir: the run directory (`--workdir`).

    Returns:
        The directory as a Path.

    Raises:
        ValueError: `workdir` (or a parent) is a regular file: a usage error.
        RunFailure: the directory cannot be created or written (read-only, no permission,
            disk full).
    """
    path = pathlib.Path(workdir)
    blocker = next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        raise ValueError(
            f"--workdir {path}: {blocker} is a regular file, not a directory ; pass a "
            "directory (created if missing), or move the file away."
        )
    try:
        path.mkdir(parents=True, exist_ok=True)
        # Writing is the only reliable test: os.access ignores read-only mounts and root.
        fd, probe = tempfile.mkstemp(prefix=".write_test.", dir=path)
        os.close(fd)
        os.remove(probe)
    except OSError as err:
        raise RunFailure(
            f"--workdir {path}: cannot write there ({err.strerror or err}) ; choose a "
            "writable --workdir, or fix its permissions or mount."
        ) from err
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Replaces the file at `path` with `text` (UTF-8) all at once.

    The text goes to a temporary file in the same directory, is flushed and fsync'ed, then
    renamed over `path` (`os.replace` is atomic on POSIX): a kill or power loss leaves the
    old file or the new one, never an empty or half-written file.
    """
    path = pathlib.Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        pathlib.Path(tmp).unlink(missing_ok=True)
        raise


def atomic_savefig(fig, path: str | os.PathLike, **kwargs) -> None:
    """`fig.savefig(path, **kwargs)` through a temporary file and a rename, as
    `atomic_write_text`: a kill never leaves a truncated picture."""
    path = pathlib.Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=path.suffix, dir=path.parent)
    os.close(fd)
    try:
        fig.savefig(tmp, **kwargs)
        os.replace(tmp, path)
    except BaseException:
        pathlib.Path(tmp).unlink(missing_ok=True)
        raise


def read_json(path: str | os.PathLike, fix: str):
    """Parses a JSON file a run wrote.

    Args:
        path: the file (config.json, results.json).
        fix: what to do when it is damaged, for the message.

    Returns:
        The parsed value.

    Raises:
        DamagedFileError: the file is empty or not valid JSON (names it and the fix).
    """
    text = pathlib.Path(path).read_text(encoding="utf-8", errors="replace")
    if not text.strip():
        raise DamagedFileError(f"{path} is empty (a run was killed while writing it?) ; {fix}")
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise DamagedFileError(
            f"{path} is not valid JSON ({err.msg} at line {err.lineno}) ; {fix}"
        ) from None


class WorkdirLockedError(RunFailure):
    """Another process holds the work directory's lock."""


class WorkdirLock:
    """An exclusive lock on a work directory, held from `__enter__` to `__exit__`.

    Usage: `with WorkdirLock(workdir): ...`. Not reentrant; the lock is per open file, so
    a second `WorkdirLock` on the same directory fails even within one process.
    """

    def __init__(self, workdir: str | os.PathLike, flag: str = "--workdir"):
        """Args:
        workdir: an existing run directory (or output folder).
        flag: the command-line flag that named it, for the message.
        """
        self.workdir = pathlib.Path(workdir)
        self.flag = flag
        self.path = RunDir(self.workdir).lock
        self._file = None

    def __enter__(self) -> WorkdirLock:
        """Takes the lock, or raises WorkdirLockedError naming the holder's pid and host."""
        file = open(self.path, "a+")  # noqa: SIM115 -- held open until __exit__
        try:
            fcntl.flock(file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            file.seek(0)
            holder = file.read().split() or ["unknown", "unknown"]
            file.close()
            pid, host = (holder + ["unknown"])[:2]
            raise WorkdirLockedError(
                f"{self.flag} {self.workdir} is in use by another run (pid {pid} on {host}, "
                f"lock {self.path}) ; wait for it to finish or stop it, or pass another "
                f"{self.flag}."
            ) from None
        file.seek(0)
        file.truncate()
        file.write(f"{os.getpid()} {socket.gethostname()}\n")
        file.flush()
        self._file = file
        return self

    def __exit__(self, *exc_info) -> None:
        """Releases the lock (the file stays: removing it would race with a new holder)."""
        if self._file is not None:
            fcntl.flock(self._file.fileno(), fcntl.LOCK_UN)
            self._file.close()
            self._file = None
