"""Sample from a trained language model: `python -m train.sample --workdir DIR --prompt "..."`.

Decoding follows the run's config (greedy unless its temperature is > 0); `--temperature`,
`--top_k` and `--top_p` override it (sampling with `--seed`), and `--max_new_tokens` its
max_decode_len, each checked as the config field is in training. Prints each prompt with
its continuation.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from absl import app, flags

from train.cli import die, parse_flags, quiet_library_logs
from train.run.failures import USAGE_ERROR


def _define_flags() -> None:
    """The program's flags; defined only when it runs, so that importing this module (tests,
    notebooks) does not clash with another program's flags in the same process."""
    flags.DEFINE_string("workdir", "runs/lm_kjv", "Run directory written by train.main.")
    flags.DEFINE_multi_string("prompt", None, "Prompt text; repeat the flag for several.")
    flags.DEFINE_integer(
        "max_new_tokens", None, "Tokens to generate; 0 = as many as fit; default: the config's."
    )
    flags.DEFINE_float("temperature", None, "0 = greedy; default: the run's config.")
    flags.DEFINE_integer("top_k", None, "Sample among the k most likely tokens (0 = all).")
    flags.DEFINE_float("top_p", None, "Nucleus sampling mass in (0, 1] (1 = off).")
    flags.DEFINE_integer("seed", 0, "PRNG seed for sampling.")
    flags.DEFINE_integer("num_samples", 1, "Samples per prompt.")


def sample_prompts(
    workdir: str | os.PathLike,
    prompts: Sequence[str],
    *,
    max_new_tokens: int | None = None,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int = 0,
    num_samples: int = 1,
) -> list[str]:
    """The program: continues each prompt `num_samples` times with the run in `workdir`; an
    option left None is the run's. Any error ends the process with one line
    (`train.cli.die`), a bad option before the checkpoint is read.

    Returns:
        Each prompt followed by its continuation, the samples of a prompt together.
    """
    from train.program.inference import sample_text
    from train.tools import tools

    quiet_library_logs()
    tools.check_positive("num_samples", num_samples)
    experiment = tools.read_experiment(workdir, tool="train.sample")
    options = tools.decode_options(
        experiment.eval.decode,
        {
            "max_new_tokens": ("max_decode_len", max_new_tokens),
            "temperature": ("temperature", temperature),
            "top_k": ("top_k", top_k),
            "top_p": ("top_p", top_p),
            "seed": ("seed", seed),
        },
    )
    asked_filter = top_k or (top_p is not None and top_p < 1.0)
    if options.temperature == 0 and asked_filter:
        # The run's own top_k/top_p are dropped for greedy decoding; explicit flags are a
        # mistake worth naming.
        die(
            f"--top_k={top_k} / --top_p={top_p} do nothing with greedy decoding "
            "(temperature 0); add --temperature (e.g. 0.8) to sample."
        )
    trained = tools.load_run(workdir)
    try:
        return sample_text(
            trained.model,
            trained.params,
            trained.tokenizer,
            [p for p in prompts for _ in range(num_samples)],
            options,
        )
    except ValueError as err:
        die(str(err))


def main(argv: list[str]) -> None:
    given = flags.FLAGS
    if len(argv) > 1:
        die(f"unexpected arguments {argv[1:]} ; pass prompts with --prompt.", USAGE_ERROR)
    if not given.prompt:
        die('no prompt ; give one: --prompt "In the beginning".', USAGE_ERROR)
    outputs = sample_prompts(
        given.workdir,
        given.prompt,
        max_new_tokens=given.max_new_tokens,
        temperature=given.temperature,
        top_k=given.top_k,
        top_p=given.top_p,
        seed=given.seed,
        num_samples=given.num_samples,
    )
    for text in outputs:
        print(text)


if __name__ == "__main__":
    _define_flags()
    app.run(main, flags_parser=parse_flags)
