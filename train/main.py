"""Train a Transformer: `python -m train.main [--config configs/<name>.py] [--workdir DIR]`.

With no flags it trains the default (configs/default.py: King James -> World English Bible
translation, ~12 minutes on a 2-core CPU) in ./runs/default. Override any config field with
`--config.<field>=value` (e.g. `--config.num_train_steps=100 --config.model.d_model=128`).
Rerunning a command resumes from its work directory's latest checkpoint.

Several processes (one per host, or several on one machine: `python -m train.launch_local`)
run the same command with `--coordinator_address=HOST:PORT --num_processes=N
--process_id=I` (or $JAX_COORDINATOR_ADDRESS, $JAX_NUM_PROCESSES, $JAX_PROCESS_ID), each
with its own index; see train.distributed and README "Many devices".

Exit status (train.cli): 0 when done; 2 for a usage error, fixed on the command line (a
bad flag, config file or value, a missing or malformed data file, a --workdir that is a
file); 1 for a run failure (a work directory that cannot be written, a disk full or other
I/O error, a damaged checkpoint, a work directory locked by another run, a diverged loss).
Either way stderr gets one line, `error: <what> ; <fix>`; `--verbosity=1` (`-v 1`) adds the
traceback and the libraries' own logs.
"""

from __future__ import annotations

import os
import pathlib
import re
import sys

from absl import app, flags, logging

from train.cli import RUN_ERROR, USAGE_ERROR, die, quiet_library_logs

DEFAULT_CONFIG = str(pathlib.Path(__file__).resolve().parent.parent / "configs" / "default.py")
DEFAULT_WORKDIR = "runs/default"

FLAGS = flags.FLAGS
flags.DEFINE_string("workdir", DEFAULT_WORKDIR, "Run directory: checkpoints, metrics, outputs.")
flags.DEFINE_string(
    "coordinator_address",
    None,
    "Multi-process runs: HOST:PORT of process 0, the same in every process "
    "(default $JAX_COORDINATOR_ADDRESS).",
)
flags.DEFINE_integer(
    "num_processes", None, "Processes in the run (default $JAX_NUM_PROCESSES, else 1)."
)
flags.DEFINE_integer(
    "process_id", None, "This process's index in [0, num_processes) (default $JAX_PROCESS_ID)."
)


def _override_error(err: Exception, argv: list[str]) -> str:
    """A readable message for an override of a field the config does not have."""
    text = str(err).replace("\\", "")  # ml_collections nests the quoted name in reprs
    found = re.search(r"'([A-Za-z_]\w*)", text)
    field = found.group(1) if found else text
    culprits = [a for a in argv if a.lstrip("-").startswith("config.") and field in a]
    shown = culprits[0] if culprits else f"--config.{field}"
    hint = re.search(r'Did you mean "(\w+)"', text)
    return (
        f"{shown}: the config has no field '{field}'"
        + (f" (did you mean '{hint.group(1)}'?)" if hint else "")
        + ". See the fields and their comments in configs/default.py (or the --config file)."
    )


def _config_path(argv: list[str]) -> str:
    """The --config file named on the command line (`--config X` or `--config=X`)."""
    for i, arg in enumerate(argv):
        if arg in ("--config", "-config") and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(("--config=", "-config=")):
            return arg.split("=", 1)[1]
    return DEFAULT_CONFIG


def _config_file_error(err: Exception, argv: list[str]) -> str:
    """One line for a --config file that cannot be loaded: what went wrong ; the fix."""
    path = _config_path(argv)
    fix = "pass a config file such as --config configs/default.py"
    if isinstance(err, SyntaxError):
        return (
            f"--config {path}: {err.msg} at line {err.lineno} (a Python syntax error) ; "
            "fix the file, or " + fix
        )
    file = pathlib.Path(path)
    if not file.exists():
        return f"--config {path}: no such file ; check the path, or {fix}"
    if file.is_dir():
        return f"--config {path}: is a directory, not a file ; {fix}"
    if not os.access(file, os.R_OK):
        return f"--config {path}: cannot be read (permission denied) ; fix its permissions"
    what = str(err).splitlines()[0] if str(err) else type(err).__name__
    return f"--config {path}: could not be loaded ({what}) ; fix the file, or {fix}"


def define_config_flag(argv: list[str]) -> None:
    """Defines --config (default: configs/default.py), exiting cleanly on a bad override.

    ml_collections applies `--config.x=...` overrides while the flag is defined (default
    config) or parsed (--config given); both raise AttributeError/KeyError for an unknown
    field, which becomes a one-line message here.
    """
    from ml_collections import config_flags

    try:
        config_flags.DEFINE_config_file(
            "config", DEFAULT_CONFIG, "Experiment config file (configs/*.py).", lock_config=True
        )
    except (AttributeError, KeyError) as err:
        die(_override_error(err, argv), USAGE_ERROR)


def parse_flags(argv: list[str]) -> list[str]:
    """absl flag parsing with one-line errors instead of tracebacks."""
    try:
        return FLAGS(argv)
    except (AttributeError, KeyError) as err:
        die(_override_error(err, argv), USAGE_ERROR)
    except (OSError, SyntaxError) as err:  # the --config file, loaded to apply overrides
        die(_config_file_error(err, argv), USAGE_ERROR)
    except flags.Error as err:
        die(str(err), USAGE_ERROR)


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        die(f"unexpected arguments {argv[1:]} ; use --flag=value.", USAGE_ERROR)
    config = FLAGS.config
    try:
        config.lock  # an unreadable config file raises when first touched  # noqa: B018
    except (OSError, SyntaxError) as err:
        die(_config_file_error(err, sys.argv), USAGE_ERROR)
    quiet_library_logs()
    # Imported after flag parsing: jax starts only for a valid command line.
    from train import distributed

    try:
        settings = distributed.settings_from_env(
            FLAGS.coordinator_address, FLAGS.num_processes, FLAGS.process_id
        )
        distributed.initialize(*settings)  # before anything else uses jax
    except ValueError as err:
        die(str(err), USAGE_ERROR)
    except Exception as err:  # jax raises runtime errors of several types
        die(
            f"could not join the other processes at {settings[0]} ({type(err).__name__}: "
            f"{str(err).splitlines()[0] if str(err) else ''}) ; start process 0 with the same "
            "--coordinator_address, reachable from this host, and every --process_id once.",
            RUN_ERROR,
        )
    if not distributed.is_primary():
        logging.set_verbosity(logging.WARNING)  # process 0 logs for the run
    from train import train_lib
    from train.cli import RunFailure
    from train.corpora import CorpusNotFoundError

    logging.info("Work directory: %s", pathlib.Path(FLAGS.workdir).absolute())
    try:
        train_lib.train_and_evaluate(config, FLAGS.workdir)
    except RunFailure as err:  # first: a damaged checkpoint is also a ValueError
        die(str(err), RUN_ERROR)
    except (ValueError, FileNotFoundError, CorpusNotFoundError) as err:
        die(str(err), USAGE_ERROR)
    except OSError as err:  # I/O during the run: disk full, a file removed or unreadable
        die(
            f"{err} ; fix the cause and rerun the same command: it resumes from the last "
            "checkpoint.",
            RUN_ERROR,
        )


def run() -> None:
    """Entry point: define the config flag, then let absl parse flags and call main."""
    define_config_flag(sys.argv)
    app.run(main, flags_parser=parse_flags)


if __name__ == "__main__":
    run()
