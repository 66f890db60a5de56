"""Translate with a trained run: `python -m train.translate --workdir DIR [SENTENCE ...]`.

Sentences come from the arguments, or one per line from stdin when there are none. Each
translation is printed on its own line, in order. Decoding follows the run's config (greedy
unless beam_size > 1); `--beam_size` overrides it.
"""

from __future__ import annotations

import dataclasses
import sys

from absl import app, flags

from train.cli import RUN_ERROR, USAGE_ERROR, RunFailure, die, parse_flags, quiet_library_logs

FLAGS = flags.FLAGS
flags.DEFINE_string("workdir", "runs/default", "Run directory written by train.main.")
flags.DEFINE_integer("beam_size", None, "Beam width; default: the run's config.")
flags.DEFINE_integer("batch_size", None, "Sentences decoded together; default: the config's.")


def main(argv: list[str]) -> None:
    sentences = [s.strip() for s in argv[1:]] or [line.strip() for line in sys.stdin]
    sentences = [s for s in sentences if s]
    if not sentences:
        die("no sentences ; give them as arguments or on stdin, one per line.", USAGE_ERROR)
    from train import checkpoint
    from train.decoding import DecodeOptions, translate
    from train.tasks import get_task

    quiet_library_logs()

    try:
        trained = checkpoint.load_trained(FLAGS.workdir)
    except RunFailure as err:  # a damaged config.json
        die(str(err), RUN_ERROR)
    except (FileNotFoundError, ValueError) as err:
        die(str(err))
    task = get_task(trained.config.task)
    if task.tool != "train.translate":
        die(
            f"{FLAGS.workdir} holds a task={task.name!r} model; use "
            f"`python -m {task.tool}` for {task.models}."
        )
    options = DecodeOptions.from_config(trained.config)
    if FLAGS.beam_size:
        options = dataclasses.replace(options, beam_size=FLAGS.beam_size)
    if FLAGS.batch_size:
        options = dataclasses.replace(options, batch_size=FLAGS.batch_size)
    try:
        outputs = translate(trained.model, trained.params, trained.tokenizer, sentences, options)
    except ValueError as err:
        die(str(err))
    for line in outputs:
        print(line)


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
