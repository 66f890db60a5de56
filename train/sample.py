"""Sample from a trained language model: `python -m train.sample --workdir DIR --prompt "..."`,
or ask a chat model: `python -m train.sample --workdir DIR --chat "..." [--system "..."]`.

Decoding follows the run's config (greedy unless its temperature is > 0); `--temperature`,
`--top_k` and `--top_p` override it (sampling with `--seed`), and `--max_new_tokens` its
max_decode_len, each checked as the config field is in training. `--prompt` prints each
prompt with its continuation. `--chat` writes the message (after `--system`'s, if given) with
the model's chat template and its generation prompt, decodes with the KV cache until the
end of the assistant's turn, and prints the reply alone: for a run that started from a
pretrained model with a chat template (`--config.task=chat`, or an 'lm' run from an Instruct
model), with the run's own template where it had one (its copy of `--config.chat_template`,
`W/chat_template.jinja`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from absl import app, flags

from train.core.cli import die, parse_flags, quiet_library_logs
from train.core.failures import USAGE_ERROR


def _define_flags() -> None:
    """The program's flags; defined only when it runs, so that importing this module (tests,
    notebooks) does not clash with another program's flags in the same process."""
    flags.DEFINE_string("workdir", "runs/lm_kjv", "Run directory written by train.main.")
    flags.DEFINE_multi_string("prompt", None, "Prompt text; repeat the flag for several.")
    flags.DEFINE_multi_string(
        "chat", None, "A user message the chat model replies to; repeat for several."
    )
    flags.DEFINE_string("system", None, "With --chat: a system message before each message.")
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
    (`train.core.cli.die`), a bad option before the checkpoint is read.

    Returns:
        Each prompt followed by its continuation, the samples of a prompt together.
    """
    from train.tasks.common.inference import sample_text
    from train.tools import tools

    quiet_library_logs()
    tools.check_positive("num_samples", num_samples)
    experiment = tools.read_experiment(workdir, tool="train.sample")
    options = _options(experiment, max_new_tokens, temperature, top_k, top_p, seed)
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


def _options(experiment, max_new_tokens, temperature, top_k, top_p, seed):
    """The run's decoding options with the flags given, checked (a one-line exit)."""
    from train.tools import tools

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
    return options


def chat_replies(
    workdir: str | os.PathLike,
    messages: Sequence[str],
    *,
    system: str | None = None,
    max_new_tokens: int | None = None,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int = 0,
    num_samples: int = 1,
) -> list[str]:
    """The program with `--chat`: the model's reply to each user message (after `system`,
    if given), `num_samples` times, rendered with the run's chat template and decoded until
    the end of the assistant's turn. Any error ends the process with one line, a bad option
    or a run without a chat template before the checkpoint is read.

    Returns:
        The replies alone, the samples of a message together.
    """
    from train.core.rundir import RunDir
    from train.data.chat.examples import run_chat_encoder
    from train.data.chat.template import run_template_file
    from train.data.tokenizers import run_tokenizer
    from train.tasks.common.inference import chat_replies as decode_replies
    from train.tools import tools

    quiet_library_logs()
    tools.check_positive("num_samples", num_samples)
    experiment = tools.read_experiment(workdir, tool="train.sample")
    options = _options(experiment, max_new_tokens, temperature, top_k, top_p, seed)
    data, run = experiment.data, RunDir(workdir)
    if not data.init_from:
        die(
            f"--chat: {workdir} trained a model from scratch, with no chat template; --chat "
            "asks a model fine-tuned from a pretrained one that has one (--config.init_from, "
            "e.g. configs/sft_smollm2.py). Continue text with --prompt instead."
        )
    try:
        tokenizer = run_tokenizer(data.tokenizer, data.vocab_size, run)
        encoder = run_chat_encoder(
            tokenizer,
            run.pretrained,
            train_on=data.train_on,
            chat_template=run_template_file(run, data.chat_template),
            init_from=data.init_from,
        )
        head = [{"role": "system", "content": system}] if system is not None else []
        prompts = [
            encoder.prompt_ids([*head, {"role": "user", "content": message}], where="--chat")
            for message in messages
        ]
    except (FileNotFoundError, ValueError) as err:
        die(f"--chat: {err}")
    trained = tools.load_run(workdir)
    try:
        return decode_replies(
            trained.model,
            trained.params,
            trained.tokenizer,
            [p for p in prompts for _ in range(num_samples)],
            options,
            encoder.stop_ids,
        )
    except ValueError as err:
        die(str(err))


def main(argv: list[str]) -> None:
    given = flags.FLAGS
    if len(argv) > 1:
        die(f"unexpected arguments {argv[1:]} ; pass prompts with --prompt.", USAGE_ERROR)
    if given.prompt and given.chat:
        die("--prompt and --chat: give one of them (text to continue, or messages to reply to).")
    if given.system is not None and not given.chat:
        die("--system goes with --chat: the system message of a conversation.")
    options = dict(
        max_new_tokens=given.max_new_tokens,
        temperature=given.temperature,
        top_k=given.top_k,
        top_p=given.top_p,
        seed=given.seed,
        num_samples=given.num_samples,
    )
    if given.chat:
        for reply in chat_replies(given.workdir, given.chat, system=given.system, **options):
            print(reply)
        return
    if not given.prompt:
        die('no prompt ; give one: --prompt "In the beginning" (or --chat "Hello").', USAGE_ERROR)
    for text in sample_prompts(given.workdir, given.prompt, **options):
        print(text)


if __name__ == "__main__":
    _define_flags()
    app.run(main, flags_parser=parse_flags)
