"""A model's chat template: where it is found, and rendering it as transformers renders it.

A chat template is a Jinja template that writes a conversation (`messages`, a list of
`{role, content}`) as the text the model was tuned on, control tokens included. Which one a
run uses, first found first:

    --config.chat_template=FILE       the user's own file
    chat_template.jinja               beside the model's tokenizer (what transformers 5 saves)
    tokenizer_config.json             its `chat_template`: a string, or a list of named
                                      templates ({name, template}) of which 'default' is taken
                                      (a GGUF file's `tokenizer.chat_template` lands here)

transformers reads the first two in the same order (a `chat_template.jinja` wins over the
config's entry).

Rendering (`ChatTemplate.render`) is transformers' (`train.data.chat.jinja`). The template
sees `messages`, `tools` (the conversation's list of tool schemas, or None, as
`apply_chat_template(tools=...)` passes it), `documents` (None), `add_generation_prompt`,
and the tokenizer's
named special tokens (`bos_token`, `eos_token`, `unk_token`, `sep_token`, `pad_token`,
`cls_token`, `mask_token`, where the tokenizer has them), as transformers 5 passes them;
lists of extra tokens (`additional_special_tokens`) are not variables there, so they are not
here.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import jinja2

from train.core.rundir import RunDir, atomic_write_text
from train.data.chat import jinja as chat_jinja
from train.formats import sources
from train.formats.sources.base import (
    CHAT_TEMPLATE_FILE,
    TOKENIZER_CONFIG_FILE,
    config_json_or_none,
)
from train.formats.sources.run import is_run_config

# The template taken from a list of named templates (transformers' choice without tools).
DEFAULT_TEMPLATE_NAME = "default"
# The named special tokens a template sees as variables (transformers 5's
# `SPECIAL_TOKENS_ATTRIBUTES`, whose `special_tokens_map` apply_chat_template passes).
SPECIAL_TOKEN_NAMES = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)


def _token_text(token: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string, or an AddedToken dict."""
    if isinstance(token, dict):
        token = token.get("content")
    return token if isinstance(token, str) else None


def special_token_variables(tokenizer_config: Mapping[str, Any]) -> dict[str, str]:
    """The special tokens a template sees, from tokenizer_config.json: the named ones
    (`SPECIAL_TOKEN_NAMES`), and the named extra tokens transformers 5 adds to them
    (`extra_special_tokens` written as a dict)."""
    names = list(SPECIAL_TOKEN_NAMES)
    extra = tokenizer_config.get("extra_special_tokens")
    if isinstance(extra, dict):
        names += [name for name in extra if name not in names]
    merged = {**tokenizer_config, **(extra if isinstance(extra, dict) else {})}
    found = {name: _token_text(merged.get(name)) for name in names}
    return {name: token for name, token in found.items() if token is not None}


@dataclasses.dataclass(frozen=True)
class Rendered:
    """A conversation as its template writes it.

    Attributes:
        text: the rendered text.
        generation_spans: the [start, end) character spans `{% generation %}` blocks wrote,
            in order (empty for a template without them).
    """

    text: str
    generation_spans: tuple[tuple[int, int], ...]


@dataclasses.dataclass(frozen=True)
class ChatTemplate:
    """A chat template and the special tokens it sees (plain strings: pickles to workers).

    Attributes:
        source: the Jinja text.
        special_tokens: variable name -> token (`bos_token`: '<|begin_of_text|>', ...).
        where: where the template was read, named in errors.
    """

    source: str
    special_tokens: Mapping[str, str] = dataclasses.field(default_factory=dict)
    where: str = "the chat template"

    def __post_init__(self):
        try:
            chat_jinja.compile_template(self.source)
        except jinja2.TemplateSyntaxError as err:
            raise ValueError(
                f"{self.where}: not a Jinja template (line {err.lineno}: {err.message}); fix "
                "the file or give another with --config.chat_template=FILE."
            ) from None

    @property
    def has_generation_blocks(self) -> bool:
        """Whether the template marks the assistant's text with `{% generation %}`."""
        return chat_jinja.has_generation_blocks(self.source)

    def literal_text(self) -> str:
        """The template's literal strings, '\\0'-joined (`chat_jinja.literal_text`)."""
        return chat_jinja.literal_text(self.source)

    def render(
        self,
        messages: Sequence[Mapping[str, str]],
        *,
        add_generation_prompt: bool = False,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> Rendered:
        """The text the template writes for `messages`, and its generation spans.

        Args:
            messages: `{role, content}` dicts (checked by the caller: `train.data.chat.encoding`).
            add_generation_prompt: end with the opening of an assistant turn (for sampling).
            tools: the tools' JSON schemas (`train.formats.corpora.conversations.check_tools`),
                or None.

        Raises:
            Exception: whatever the template raises: `jinja2.TemplateError` where it refuses
                the conversation (its `raise_exception`), a TypeError where it loops over
                tools it was not given...; the caller names the conversation.
        """
        text, spans = chat_jinja.render(
            self.source,
            {
                "messages": [dict(m) for m in messages],
                "tools": None if tools is None else [dict(t) for t in tools],
                "documents": None,
                "add_generation_prompt": add_generation_prompt,
                **self.special_tokens,
            },
        )
        return Rendered(text, spans)


def _named_template(value: Any, where: str) -> str:
    """tokenizer_config.json's `chat_template`: a string, or named templates ('default')."""
    if isinstance(value, str):
        return value
    named = None
    if isinstance(value, list) and all(
        isinstance(t, dict) and "name" in t and "template" in t for t in value
    ):
        named = {t["name"]: t["template"] for t in value}
    elif isinstance(value, dict):
        named = value
    if named is None:
        raise ValueError(
            f"{where}: chat_template is neither a string nor a list of {{name, template}}; "
            "give the template with --config.chat_template=FILE."
        )
    if DEFAULT_TEMPLATE_NAME not in named or not isinstance(named[DEFAULT_TEMPLATE_NAME], str):
        raise ValueError(
            f"{where}: chat_template holds the templates {sorted(named)} and none named "
            f"{DEFAULT_TEMPLATE_NAME!r}; write the one to use to a file and give it with "
            "--config.chat_template=FILE."
        )
    return named[DEFAULT_TEMPLATE_NAME]


def find_chat_template(
    tokenizer_config: Mapping[str, Any],
    *,
    directory: str | os.PathLike | None = None,
    template_file: str | os.PathLike | None = None,
    where: str = "the model",
) -> ChatTemplate:
    """The chat template a model's files give, with its special tokens (first found:
    `template_file`, `directory/chat_template.jinja`, `tokenizer_config['chat_template']`).

    Args:
        tokenizer_config: the model's tokenizer_config.json (a GGUF file's, with its
            `tokenizer.chat_template` as `chat_template`).
        directory: the directory holding the tokenizer files, if any.
        template_file: `--config.chat_template`: a Jinja file that overrides the model's.
        where: the model, as errors name it.

    Raises:
        ValueError: no template anywhere, a file that does not read, named templates
            without a 'default', or a template that is not Jinja.
    """
    specials = special_token_variables(tokenizer_config)
    if template_file:
        path = pathlib.Path(template_file)
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise ValueError(
                f"--config.chat_template={str(template_file)!r}: cannot read it ({err})."
            ) from None
        return ChatTemplate(text, specials, f"--config.chat_template={str(template_file)!r}")
    if directory is not None and (pathlib.Path(directory) / CHAT_TEMPLATE_FILE).is_file():
        path = pathlib.Path(directory) / CHAT_TEMPLATE_FILE
        return ChatTemplate(path.read_text(encoding="utf-8"), specials, str(path))
    value = tokenizer_config.get("chat_template")
    if value is None:
        raise ValueError(
            f"{where} has no chat template (no {CHAT_TEMPLATE_FILE}, no chat_template in "
            f"{TOKENIZER_CONFIG_FILE}): a base model was not tuned on conversations; start "
            "from an Instruct model, or give a template with --config.chat_template=FILE."
        )
    where = f"{where}'s {TOKENIZER_CONFIG_FILE}"
    return ChatTemplate(_named_template(value, where), specials, f"the chat template of {where}")


def source_chat_template(
    source: sources.Source,
    template_file: str | os.PathLike | None = None,
    *,
    where: str | None = None,
) -> ChatTemplate:
    """The chat template of a pretrained source (`--config.init_from`), or `template_file`
    (`--config.chat_template`) with the source's special tokens: a Hugging Face directory's
    files, a GGUF file's `tokenizer.chat_template`, or those of the model a run started from
    (its snapshot, `train.formats.sources.origin`).

    Args:
        source: the pretrained source, or a run's snapshot of it.
        template_file: `--config.chat_template`, or None.
        where: the source as errors name it (default: `--config.init_from=<its path>`; a
            run reading its snapshot names the source the user gave).

    Raises:
        ValueError: as `find_chat_template`; a run trained from scratch (its tokenizer has
            no control tokens to write a conversation with).
    """
    model = sources.origin(source)
    where = where or f"--config.init_from={str(source.path)!r}"
    if model is None:
        raise ValueError(
            f"{where} is a run trained from scratch: its tokenizer has no chat template or "
            "control tokens; fine-tune a pretrained Instruct model instead."
        )
    if not template_file and source.trained_here:
        template_file = inherited_template(source.path) or None
    files = model.chat_files()
    return find_chat_template(
        files.tokenizer_config,
        directory=files.directory,
        template_file=template_file,
        where=where,
    )


def inherited_template(directory: str | os.PathLike) -> str:
    """The chat template file a chain of runs trained with: the copy a run kept of its own
    template (`RunDir.chat_template`) in the run `directory`, or in the snapshots of the runs
    it started from (`pretrained/`: DPO started from an SFT run), nearest first; '' where
    no run of the chain had one (the pretrained model's own template applies)."""
    path = pathlib.Path(directory)
    while is_run_config(config_json_or_none(path)):
        kept = RunDir(path).chat_template
        if kept.is_file():
            return str(kept)
        path = path / RunDir.PRETRAINED
    return ""


def keep_run_template(template_file: str, run: RunDir) -> None:
    """Copies a run's own chat template file (`--config.chat_template`) into its directory
    (`RunDir.chat_template`), so that `train.sample --chat` and `train.export` read the
    template it trained with after the user's file has moved or changed. Nothing for a run
    without one; a file that does not read is left to the encoder, which refuses it naming
    the flag."""
    if not template_file:
        return
    try:
        text = pathlib.Path(template_file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return
    atomic_write_text(run.chat_template, text)


def run_template_file(run: RunDir, template_file: str) -> str:
    """The chat template file a trained run's tools read: its copy (`keep_run_template`)
    where the run had a template of its own, else `template_file` (the user's path, for a
    run from before the copy was kept); for a run without one, the template of the run it
    started from (`inherited_template`), or '' (the model's template)."""
    if template_file and run.chat_template.is_file():
        return str(run.chat_template)
    return template_file or inherited_template(run.pretrained)
