"""Translate with a trained run: `python -m train.translate --workdir DIR [SENTENCE ...]`.

Sentences come from the arguments, or one per line from stdin when there are none. Each
translation is printed on its own line, in order. Decoding follows the run's config (greedy
unless beam_size > 1); `--beam_size`, `--length_penalty`, `--max_decode_len` and
`--batch_size` override it, each checked as the config field is in training.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from absl import app, flags

from train.core.cli import die, parse_flags, quiet_library_logs
from train.core.failures import USAGE_ERROR


def _define_flags() -> None:
    """The program's flags; defined only when it runs, so that importing this module (tests,
    notebooks) does not clash with another program's flags in the same process."""
    flags.DEFINE_string("workdir", "runs/default", "Run directory written by train.main.")
    flags.DEFINE_integer("beam_size", None, "Beam width (1 = greedy); default: the run's config.")
    flags.DEFINE_float(
        "length_penalty", None, "Beam search length penalty alpha; default: the run's config."
    )
    flags.DEFINE_integer(
        "max_decode_len", None, "Tokens generated at most (0 = as many as fit); default: config."
    )
    flags.DEFINE_integer("batch_size", None, "Sentences decoded together; default: the config's.")


def translate_sentences(
    workdir: str | os.PathLike,
    sentences: Sequence[str],
    *,
    beam_size: int | None = None,
    length_penalty: float | None = None,
    max_decode_len: int | None = None,
    batch_size: int | None = None,
) -> list[str]:
    """The program: translates `sentences` with the run in `workdir`; an option left None
    is the run's. Any error ends the process with one line (`train.core.cli.die`), a bad option
    before the checkpoint is read.

    Returns:
        One translation per sentence, in order.
    """
    from train.tasks.common.inference import translate
    from train.tools import tools

    quiet_library_logs()
    experiment = tools.read_experiment(workdir, tool="train.translate")
    options = tools.decode_options(
        experiment.eval.decode,
        {
            "beam_size": ("beam_size", beam_size),
            "length_penalty": ("length_penalty", length_penalty),
            "max_decode_len": ("max_decode_len", max_decode_len),
            "batch_size": ("batch_size", batch_size),
        },
    )
    trained = tools.load_run(workdir)
    try:
        return translate(trained.model, trained.params, trained.tokenizer, sentences, options)
    except ValueError as err:
        die(str(err))


def main(argv: list[str]) -> None:
    sentences = [s.strip() for s in argv[1:]] or [line.strip() for line in sys.stdin]
    sentences = [s for s in sentences if s]
    if not sentences:
        die("no sentences ; give them as arguments or on stdin, one per line.", USAGE_ERROR)
    given = flags.FLAGS
    outputs = translate_sentences(
        given.workdir,
        sentences,
        beam_size=given.beam_size,
        length_penalty=given.length_penalty,
        max_decode_len=given.max_decode_len,
        batch_size=given.batch_size,
    )
    for line in outputs:
        print(line)


if __name__ == "__main__":
    _define_flags()
    app.run(main, flags_parser=parse_flags)
