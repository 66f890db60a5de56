"""Train a Transformer: `python -m train.main [--config configs/<name>.py] [--workdir DIR]`.

With no flags it trains the default (configs/default.py: King James -> World English Bible
translation, minutes on a 2-core CPU; README.md's results table has the measured time) in
./runs/default. Override any config field with `--config.<field>=value` (e.g.
`--config.num_train_steps=100 --config.model.d_model=128`).
Rerunning a command resumes from its work directory's latest checkpoint.

Several processes (one per host, or several on one machine: `python -m train.launch_local`)
run the same command with `--coordinator_address=HOST:PORT --num_processes=N
--process_id=I` (or $JAX_COORDINATOR_ADDRESS, $JAX_NUM_PROCESSES, $JAX_PROCESS_ID), each
with its own index; see train.core.distributed and docs/multiprocess.md.

Exit status (train.core.cli): 0 when done; 2 for a usage error, fixed on the command line (a
bad flag, config file or value, a missing or malformed data file, a --workdir that is a
file); 1 for a run failure (a work directory that cannot be written, a disk full or other
I/O error, a damaged checkpoint, a work directory locked by another run, a diverged loss).
Either way stderr gets one line, `error: <what> ; <fix>`; `--verbosity=1` (`-v 1`) adds the
traceback and the libraries' own logs. SIGTERM (a preemption notice) makes the run save a
checkpoint at the next step boundary, print `preempted: SIGTERM at step N; ...` to stderr
and exit with 143; rerunning the same command resumes from that step.
"""

from __future__ import annotations

import pathlib
import sys

from absl import app, flags, logging

from train.core.cli import (
    define_config_flag,
    die,
    loaded_config,
    parse_config_flags,
    quiet_library_logs,
)
from train.core.failures import PREEMPTED, RUN_ERROR, USAGE_ERROR

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


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        die(f"unexpected arguments {argv[1:]} ; use --flag=value.", USAGE_ERROR)
    config = loaded_config(FLAGS.config)
    quiet_library_logs()
    # Imported after flag parsing: jax starts only for a valid command line.
    from train.core import distributed

    try:
        settings = distributed.settings_from_env(
            FLAGS.coordinator_address, FLAGS.num_processes, FLAGS.process_id
        )
        # Both before anything else uses jax: the CPU's devices and the other processes.
        cpu_devices = distributed.split_cpu(config, settings[1])
        distributed.initialize(*settings)
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
    import jax

    import train
    from train.core.failures import Preempted, RunFailure
    from train.formats.corpora.corpus import CorpusNotFoundError
    from train.program import loop as train_lib

    logging.info("Work directory: %s", pathlib.Path(FLAGS.workdir).absolute())
    if cpu_devices > 1 and jax.default_backend() == "cpu":
        logging.info(
            "CPU split into %d devices, data parallel (--config.cpu_devices=1: one device)",
            jax.device_count(),
        )
    try:
        # Every record's wall_s counts from the command's start (compilation included).
        train_lib.train_and_evaluate(config, FLAGS.workdir, started=train.STARTED)
    except Preempted as err:  # a checkpoint was saved: not an error
        print(err, file=sys.stderr, flush=True)
        sys.exit(PREEMPTED)
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
    app.run(main, flags_parser=parse_config_flags)


if __name__ == "__main__":
    run()
