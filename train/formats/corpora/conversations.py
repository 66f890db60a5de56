"""A conversation as a corpus holds it (`Conversation`), and the records it is read from:
a JSON line or a Hugging Face row with `messages`, or with `prompt` and `completion`.

    {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]}
    {"prompt": "Hi", "completion": "Hello"}
    {"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
     "completion": [{"role": "assistant", "content": "Hello"}]}
    {"messages": [...], "tools": [{"type": "function", "function": {"name": ..., ...}}]}

A string prompt is one user message, a string completion one assistant message; message
lists are taken as they are (TRL's conversational prompt-completion). Which tokens are
trained is `--config.train_on`'s choice either way (`TRAIN_ON`, `train.data.chat.encoding`).
A record's `tools` (TRL's `tools` column: a list of JSON schemas, or that list as a JSON
string) is handed to the chat template as transformers' `apply_chat_template(tools=...)`
hands it: templates of tool-using models (Hermes, Command-R, Qwen3) write the tools into
the system turn, and some of them cannot render a conversation without it. Other keys of a
record, and of a message, are not read.

This module is plain Python (no template engine, no tokenizer): the corpus table and the
config sections read it, and `train.data.chat.encoding` renders what it checks.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

# The roles a message may have.
ROLES = ("system", "user", "assistant")
# `--config.train_on` values: which tokens of a conversation are trained
# (`train.data.chat.encoding`).
TRAIN_ON = ("assistant", "last", "all")
# The record keys a conversation is read from, as the errors name them.
MESSAGES, PROMPT, COMPLETION, TOOLS = "messages", "prompt", "completion", "tools"


class ChatError(ValueError):
    """A conversation or template refused (the message names which, and the fix)."""


def check_messages(messages: Any, where: str) -> list[dict[str, str]]:
    """`messages` as a list of `{role, content}` dicts (other keys are not passed on).

    Raises:
        ChatError: not a non-empty list of dicts, a role outside `ROLES`, or a content that
            is not a string (naming `where` and the message).
    """
    if not isinstance(messages, (list, tuple)) or not messages:
        raise ChatError(
            f"{where}: 'messages' must be a non-empty list of {{role, content}}, got "
            f"{type(messages).__name__ if messages else messages!r}."
        )
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise ChatError(f"{where}: messages[{i}] is a {type(message).__name__}, not a dict.")
        role, content = message.get("role"), message.get("content")
        if role not in ROLES:
            raise ChatError(
                f"{where}: messages[{i}] has role {role!r}; the roles are {', '.join(ROLES)}."
            )
        if not isinstance(content, str):
            raise ChatError(
                f"{where}: messages[{i}] ({role}) has content of type {type(content).__name__}; "
                "it must be a string (an empty one is allowed)."
            )
        out.append({"role": role, "content": content})
    return out


def check_tools(tools: Any, where: str) -> tuple[dict[str, Any], ...] | None:
    """A conversation's `tools` as a tuple of dicts (None: no tools, as a template sees it).

    Args:
        tools: None, a list of JSON objects (the tools' schemas), or that list as a JSON
            string (how some datasets store the column).
        where: the conversation, as errors name it.

    Raises:
        ChatError: anything else (naming `where` and what was found).
    """
    if tools is None:
        return None
    if isinstance(tools, str):
        try:
            tools = json.loads(tools) if tools.strip() else None
        except json.JSONDecodeError as err:
            raise ChatError(
                f"{where}: field {TOOLS!r} is a string that is not JSON ({err.msg} at "
                f"column {err.colno}); give a list of tool schemas."
            ) from None
        if tools is None:
            return None
    if not isinstance(tools, (list, tuple)) or not all(isinstance(t, Mapping) for t in tools):
        raise ChatError(
            f"{where}: field {TOOLS!r} must be a list of tool schemas (JSON objects, "
            f"{{'type': 'function', 'function': {{...}}}}), got {type(tools).__name__}"
            f"{'' if not isinstance(tools, (list, tuple)) else ' holding non-objects'}."
        )
    return tuple(dict(t) for t in tools)


@dataclasses.dataclass(frozen=True, eq=True)
class Conversation:
    """One conversation, checked, as a corpus holds it (text: rendering and tokenizing are
    the run's, `train.data.chat.examples`).

    Attributes:
        messages: `{role, content}` dicts (`train.data.chat.encoding.check_messages`).
        where: where it was read, as errors name it ('train.jsonl:17').
        split_key: the text its train/validation/test split is decided by
            (`train.formats.corpora.splits`): the messages as JSON, or what the corpus says
            (the chat made of the KJV -> WEB pairs keys a verse as the pair does, so both
            tasks hold out the same verses).
        tools: the tools the template is given (`check_tools`), or None.
    """

    messages: tuple[Mapping[str, str], ...]
    where: str = "a conversation"
    split_key: str = ""
    tools: tuple[Mapping[str, Any], ...] | None = None

    def __post_init__(self):
        object.__setattr__(self, "messages", tuple(self.messages))
        if self.tools is not None:
            object.__setattr__(self, "tools", tuple(self.tools))
        if not self.split_key:
            key = json.dumps([[m["role"], m["content"]] for m in self.messages], ensure_ascii=False)
            object.__setattr__(self, "split_key", key)

    @property
    def reply(self) -> str | None:
        """The content of the last message where it is the assistant's, else None."""
        last = self.messages[-1]
        return last["content"] if last["role"] == "assistant" else None

    @property
    def prompt(self) -> tuple[Mapping[str, str], ...]:
        """The messages before the last (the assistant's reply): what the model answers."""
        return self.messages[:-1]


def _message_list(value: Any, where: str, field: str, role: str) -> list[dict[str, str]]:
    """A record's `prompt` or `completion`: a string (one message of `role`) or a message
    list, checked."""
    if isinstance(value, str):
        return [{"role": role, "content": value}]
    if not isinstance(value, (list, tuple)):
        raise ChatError(
            f"{where}: field {field!r} is a {type(value).__name__}; it must be a string (one "
            f"{role} message) or a list of {{role, content}}."
        )
    return check_messages(value, f"{where}: field {field!r}")


def conversation_of(record: Any, where: str, split_key: str = "") -> Conversation:
    """The conversation of one record (see the module docstring).

    Args:
        record: a JSON object or a dataset row.
        where: where it was read ('train.jsonl:17'), named in errors.
        split_key: its split key; '' = its messages as JSON.

    Raises:
        ChatError: a record that is not an object, holds neither `messages` nor `prompt`
            and `completion` (or both kinds), or a field that is not what it must be
            (`tools` included; naming `where` and the field).
    """
    if not isinstance(record, Mapping):
        raise ChatError(
            f"{where}: a JSON {type(record).__name__}, not an object with {MESSAGES!r}, or "
            f"{PROMPT!r} and {COMPLETION!r}."
        )
    has_messages = MESSAGES in record
    has_pair = PROMPT in record or COMPLETION in record
    if has_messages and has_pair:
        raise ChatError(
            f"{where}: holds both {MESSAGES!r} and {PROMPT!r}/{COMPLETION!r}; give one of them."
        )
    if has_messages:
        messages = check_messages(record[MESSAGES], f"{where}: field {MESSAGES!r}")
    elif PROMPT in record and COMPLETION in record:
        messages = _message_list(record[PROMPT], where, PROMPT, "user") + _message_list(
            record[COMPLETION], where, COMPLETION, "assistant"
        )
    else:
        missing = COMPLETION if PROMPT in record else PROMPT if has_pair else MESSAGES
        raise ChatError(
            f"{where}: no field {missing!r}; a conversation is {{{MESSAGES!r}: [...]}} or "
            f"{{{PROMPT!r}: ..., {COMPLETION!r}: ...}} (it has {sorted(record)})."
        )
    tools = check_tools(record.get(TOOLS), where)
    return Conversation(tuple(messages), where, split_key, tools)
