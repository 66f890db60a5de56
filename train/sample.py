"""Sample from a trained language model: `python -m train.sample --workdir DIR --prompt "..."`.

Greedy by default; `--temperature`, `--top_k` and `--top_p` sample instead (with `--seed`).
Prints each prompt with its continuation.
"""

from __future__ import annotations

import dataclasses

from absl import app, flags

from train.cli import RUN_ERROR, USAGE_ERROR, RunFailure, die, parse_flags, quiet_library_logs

FLAGS = flags.FLAGS
flags.DEFINE_string("workdir", "runs/lm_kjv", "Run directory written by train.main.")
flags.DEFINE_multi_string("prompt", None, "Prompt text; repeat the flag for several.")
flags.DEFINE_integer("max_new_tokens", None, "Tokens to generate; default: as many as fit.")
flags.DEFINE_float("temperature", None, "0 = greedy; default: the run's config.")
flags.DEFINE_integer("top_k", None, "Sample among the k most likely tokens (0 = all).")
flags.DEFINE_float("top_p", None, "Nucleus sampling mass (1 = off).")
flags.DEFINE_integer("seed", 0, "PRNG seed for sampling.")
flags.DEFINE_integer("num_samples", 1, "Samples per prompt.")


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        die(f"unexpected arguments {argv[1:]} ; pass prompts with --prompt.", USAGE_ERROR)
    if not FLAGS.prompt:
        die('no prompt ; give one: --prompt "In the beginning".', USAGE_ERROR)
    import jax

    from train import checkpoint
    from train.decoding import DecodeOptions, sample_text
    from train.tasks import get_task

    quiet_library_logs()

    try:
        trained = checkpoint.load_trained(FLAGS.workdir)
    except RunFailure as err:  # a damaged config.json
        die(str(err), RUN_ERROR)
    except (FileNotFoundError, ValueError) as err:
        die(str(err))
    task = get_task(trained.config.task)
    if task.tool != "train.sample":
        die(
            f"{FLAGS.workdir} holds a task={task.name!r} model; use "
            f"`python -m {task.tool}` for {task.models}."
        )
    flagged = {
        name: getattr(FLAGS, name)
        for name in ("temperature", "top_k", "top_p")
        if getattr(FLAGS, name) is not None
    }
    options = dataclasses.replace(DecodeOptions.from_config(trained.config), **flagged)
    asked_filter = FLAGS.top_k or (FLAGS.top_p is not None and FLAGS.top_p < 1.0)
    if options.temperature == 0 and asked_filter:
        # The run's own top_k/top_p are dropped for greedy decoding; explicit flags are a
        # mistake worth naming.
        die(
            f"--top_k={FLAGS.top_k} / --top_p={FLAGS.top_p} do nothing with greedy decoding "
            "(temperature 0); add --temperature (e.g. 0.8) to sample."
        )
    prompts = [p for p in FLAGS.prompt for _ in range(FLAGS.num_samples)]
    try:
        outputs = sample_text(
            trained.model,
            trained.params,
            trained.tokenizer,
            prompts,
            options,
            rng=jax.random.key(FLAGS.seed),
            max_new_tokens=FLAGS.max_new_tokens,
        )
    except ValueError as err:
        die(str(err))
    for text in outputs:
        print(text)


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
