"""Pictures of a trained model: attention maps per layer and head, and the positional encoding.

    python -m train.visualize --workdir runs/default --text "初に神天地を創造たまへり"
    python -m train.visualize --workdir runs/lm_kjv --text "In the beginning"

For a translation run the source is translated greedily (or, with `--target`, the given
target is fed to the decoder: teacher forcing), then one forward pass over (source, BOS +
target) records every attention (`train.tools.attention_recording`); for a language model the
prompt is continued and the whole sequence is passed once. PNG files go to `--out` (default
`WORKDIR/pictures`), drawn by `train.tools.attention_figures`: encoder_self_attention.png,
decoder_self_attention.png, decoder_cross_attention.png and positional_encoding.png.

With `--html` the same example goes into the attention explorer instead (`train.tools.explorer`):
one interactive, self-contained HTML page; `--out` names the file, default
`WORKDIR/pictures/explorer.html`:

    python -m train.visualize --workdir runs/default --text "In the beginning" --html

What differs between a translation run and a language model (the prompt, how it is decoded,
whether a target may be given) is the run's `Task` (`train.tasks`).
"""

from __future__ import annotations

import pathlib
import time
from collections.abc import Sequence
from typing import Any

from absl import app, flags
from flax import linen as nn

from train.core.cli import die, parse_flags, quiet_library_logs
from train.core.failures import RUN_ERROR, USAGE_ERROR, RunFailure
from train.core.rundir import RunDir, WorkdirLock
from train.tasks import Task, get_task
from train.tools import tools
from train.tools.attention_figures import render_all
from train.tools.attention_recording import model_variables
from train.tools.explorer import render_explorer


def example_ids(
    task: Task, model: nn.Module, params: Any, tokenizer, text: str, max_new_tokens: int
) -> tuple[list[int] | None, list[int], int]:
    """Greedy decoding of one example, as the ids the forward pass then runs on.

    Args:
        task: the run's task, which says what `text` is and how the model decodes it.
        model: a `Transformer` (text is the source) or `DecoderOnlyTransformer` (the prompt).
        params: `model.init`'s output or its `['params']`.
        tokenizer: encodes `text` and gives the BOS/EOS ids.
        text: the source sentence or the prompt.
        max_new_tokens: the most tokens generated (capped to fit the model's max_len).

    Returns:
        `(source ids or None, decoder ids, prompt length)`: the decoder ids are BOS + the
        greedy translation (EOS cut), or BOS + prompt + continuation; the prompt length counts
        the ids before the generated ones (1 for translation: BOS).

    Raises:
        ValueError: `text` is empty or longer than the model's max_len allows.
    """
    cfg = model.config
    variables = model_variables(model, params)
    encoded = tokenizer.encode(text)
    if not encoded:
        raise ValueError(f"--text {text!r} has no tokens; give a sentence or a prompt.")
    source, prompt = task.shown_prompt(tokenizer, encoded)
    room = cfg.max_len - len(prompt)
    if len(encoded) > cfg.max_len or room < 1:
        raise ValueError(
            f"--text has {len(encoded)} tokens; the model's max_len={cfg.max_len} leaves no "
            "room to generate after it: shorten the text."
        )
    new = task.greedy_continuation(
        model, variables, tokenizer, source, prompt, min(max_new_tokens, room)
    )
    return source, prompt + new, len(prompt)


def _define_flags() -> None:
    """The program's flags; defined only when it runs, so that importing this module (tests,
    notebooks) does not clash with the flags of `train.main` in the same process."""
    flags.DEFINE_string("workdir", None, "Run directory written by train.main.", required=True)
    flags.DEFINE_string("text", None, "Source sentence, or the LM's prompt.", required=True)
    flags.DEFINE_string(
        "out",
        None,
        "Output folder for the PNGs (default WORKDIR/pictures); with --html, the HTML file "
        "(default WORKDIR/pictures/explorer.html).",
    )
    flags.DEFINE_integer("max_new_tokens", 24, "Tokens decoded at most after the text.")
    flags.DEFINE_string(
        "target",
        None,
        "Translation runs: feed this target to the decoder (BOS + its tokens, teacher "
        "forcing, as in training) instead of the greedy translation.",
    )
    flags.DEFINE_bool(
        "html",
        False,
        "Write the interactive attention explorer (one self-contained HTML file) instead of "
        "the PNG pictures.",
    )


def main(argv: Sequence[str]) -> None:
    if len(argv) > 1:
        die(f"unexpected arguments {list(argv[1:])} ; quote the --text.", USAGE_ERROR)
    given = flags.FLAGS
    visualize(given.workdir, given.text, given.out, given.max_new_tokens, given.html, given.target)


def given_target_ids(
    task: Task, model: nn.Module, tokenizer, text: str, target: str
) -> tuple[list, list]:
    """`(source ids, BOS + target ids)` of a translation example whose target is given.

    Raises:
        ValueError: the task takes no target (a language model), a text is empty, or a side
            is longer than the model's max_len.
    """
    src_ids, tgt_ids = task.given_target(tokenizer, text, target)
    max_len = model.config.max_len
    for flag, ids in (("--text", src_ids), ("--target", tgt_ids)):
        if not ids:
            raise ValueError(f"{flag} has no tokens; give a sentence.")
        if len(ids) > max_len:
            raise ValueError(
                f"{flag} has {len(ids)} tokens (with BOS for --target); the model's "
                f"max_len={max_len} is the most: shorten it."
            )
    return src_ids, tgt_ids


def visualize(
    workdir: str,
    text: str,
    out: str | None = None,
    max_new_tokens: int = 24,
    html: bool = False,
    target: str | None = None,
) -> list[pathlib.Path]:
    """The program: loads the run, decodes `text` (or takes the given `target`), writes the
    pictures (or the page) and prints what it wrote. Any error ends the process with one
    line (`train.core.cli.die`).

    Returns:
        The paths written.
    """
    quiet_library_logs()
    tools.check_positive("max_new_tokens", max_new_tokens)
    run = tools.load_run(workdir)
    tok = run.tokenizer
    task = get_task(run.experiment.data.task)
    started = time.perf_counter()
    try:
        if target is None:
            src_ids, tgt_ids, prompt_length = example_ids(
                task, run.model, run.params, tok, text, max_new_tokens
            )
        else:
            src_ids, tgt_ids = given_target_ids(task, run.model, tok, text, target)
            prompt_length = None  # every decoder input given
    except ValueError as err:
        die(str(err))
    if src_ids is None:
        print(f"prompt + continuation: {tok.decode(tgt_ids)}")
    elif prompt_length is None:
        print(f"source: {text}\ntarget (given, teacher-forced): {tok.decode(tgt_ids[1:])}")
    else:
        print(f"source: {text}\ntranslation: {tok.decode(tgt_ids[prompt_length:])}")
    html_default = RunDir(workdir).explorer
    html_path = pathlib.Path(out) if out else html_default
    folder = html_path.parent if html else pathlib.Path(out or html_default.parent)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        # Two visualize runs writing one folder would interleave their files.
        with WorkdirLock(folder, flag="--out"):
            if html:
                title = f"{pathlib.Path(workdir).name} (step {run.step}): {text}"
                path = render_explorer(
                    run.model,
                    run.params,
                    tok,
                    src_ids,
                    tgt_ids,
                    html_path,
                    prompt_length=prompt_length,
                    title=title,
                )
                seconds = time.perf_counter() - started
                print(
                    f"wrote {path} ({path.stat().st_size / 1024:.0f} KiB; "
                    f"{'' if target else 'decoding, '}the forward pass and writing took "
                    f"{seconds:.1f} s)"
                )
                return [path]
            written = render_all(run.model, run.params, tok, src_ids, tgt_ids, folder)
            for path in written:
                print(f"wrote {path}")
            return written
    except RunFailure as err:  # the folder is locked by another visualize run
        die(str(err), RUN_ERROR)
    except OSError as err:
        die(f"{err} ; choose a writable --out, or free disk space.", RUN_ERROR)


if __name__ == "__main__":
    _define_flags()
    app.run(main, flags_parser=parse_flags)
